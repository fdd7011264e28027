//! The `ferroce` command-line tool.
fn main() {}
