//! Reading a saved dump given on the command line: a file, or standard input for `-`.

use std::io::Read;
use std::path::Path;

/// The bytes of `path`, or of standard input when it is `-`.
pub fn read_path_or_stdin(path: &Path) -> std::io::Result<Vec<u8>> {
    if path.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf)?;
        return Ok(buf);
    }
    std::fs::read(path)
}
