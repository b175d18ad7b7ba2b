// Prints Go's own answers to time.ParseDuration and strconv.ParseBool for the inputs in
// inputs.txt (one per line, as a Go-quoted string), one tab-separated line per input:
//
//	duration <quoted input> ok <nanoseconds>
//	duration <quoted input> err <quoted error text>
//
// and the same with "bool" for strconv.ParseBool. leasehold-types' tests compare its parser
// with this table (answers.txt). Regenerate with: go run . < inputs.txt > answers.txt
package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"time"
)

func main() {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		line := in.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := strconv.Unquote(line)
		if err != nil {
			panic(fmt.Sprintf("%s: %v", line, err))
		}
		if d, err := time.ParseDuration(s); err != nil {
			fmt.Printf("duration\t%s\terr\t%s\n", strconv.Quote(s), strconv.Quote(err.Error()))
		} else {
			fmt.Printf("duration\t%s\tok\t%d\n", strconv.Quote(s), int64(d))
		}
		if b, err := strconv.ParseBool(s); err != nil {
			fmt.Printf("bool\t%s\terr\t%s\n", strconv.Quote(s), strconv.Quote(err.Error()))
		} else {
			fmt.Printf("bool\t%s\tok\t%t\n", strconv.Quote(s), b)
		}
	}
}
