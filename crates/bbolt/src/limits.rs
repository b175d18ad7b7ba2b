//! bbolt's limits on what a bucket holds, which the writer enforces and its errors name.

/// bbolt's longest allowed key.
pub const MAX_KEY_SIZE: usize = 32768;
/// bbolt's longest allowed value.
pub const MAX_VALUE_SIZE: usize = (1 << 31) - 2;
