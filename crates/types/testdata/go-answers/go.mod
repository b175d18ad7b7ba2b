module leasehold.invalid/goanswers

go 1.22
