//! The `partition` binary is linked as tools/partition-cli/build.rs says
//! (docs/architecture.md, "Building"): the launch's functions gathered in `.text.launch`
//! ahead of `.text` (launch-order.ld), and relative relocations packed (`.relr.dyn`).

/// `(name, address, size)` of every section header of a 64-bit little-endian ELF.
fn sections(elf: &[u8]) -> Vec<(String, u64, u64)> {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    assert_eq!(&elf[..4], b"\x7fELF");
    assert_eq!((elf[4], elf[5]), (2, 1), "64-bit little-endian");
    let (shoff, shentsize, shnum, shstrndx) = (
        u64_at(0x28) as usize,
        u16_at(0x3a),
        u16_at(0x3c),
        u16_at(0x3e),
    );
    let header = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(header(shstrndx) + 0x18) as usize;
    (0..shnum)
        .map(|i| {
            let h = header(i);
            let name_at = strtab + u32_at(h);
            let end = elf[name_at..].iter().position(|&b| b == 0).unwrap();
            let name = String::from_utf8_lossy(&elf[name_at..name_at + end]).into_owned();
            (name, u64_at(h + 0x10), u64_at(h + 0x20))
        })
        .collect()
}

#[test]
fn the_launch_path_comes_first_and_relocations_are_packed() {
    let elf = std::fs::read(env!("CARGO_BIN_EXE_partition")).unwrap();
    let s = sections(&elf);
    let get = |n: &str| s.iter().find(|x| x.0 == n).cloned();
    let names: Vec<&str> = s.iter().map(|x| x.0.as_str()).collect();
    let (_, launch_at, launch_size) = get(".text.launch").unwrap_or_else(|| panic!("{names:?}"));
    let (_, text_at, text_size) = get(".text").unwrap();
    // This is a test build, not the traced release one: its hashes differ, so what lands
    // in .text.launch is what the hash-free patterns find. Still a good part of the code.
    assert!(
        launch_size > 256 << 10,
        ".text.launch holds {launch_size} bytes"
    );
    assert!(launch_at < text_at, ".text.launch is ahead of .text");
    assert!(text_size > 0);
    let (_, _, relr) = get(".relr.dyn").unwrap_or_else(|| panic!("no .relr.dyn: {names:?}"));
    assert!(relr > 0);
}
