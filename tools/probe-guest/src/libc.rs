//! The few C symbols the compiler expects: the host target's `compiler_builtins` leaves them
//! to libc, which a freestanding guest does not have. Written with string instructions so
//! the compiler cannot turn them back into calls to themselves. They run in ring 3.

use core::arch::asm;

#[unsafe(no_mangle)]
unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees non-overlapping valid ranges of n bytes.
    unsafe {
        asm!("rep movsb", inout("rdi") dst => _, inout("rsi") src => _, inout("rcx") n => _,
             options(nostack, preserves_flags));
    }
    dst
}

#[unsafe(no_mangle)]
unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize) <= (src as usize) || (dst as usize) >= (src as usize + n) {
        // SAFETY: forward copy is safe when dst does not start inside src.
        unsafe { memcpy(dst, src, n) }
    } else {
        // SAFETY: backward copy with the direction flag, restored before returning.
        unsafe {
            asm!("std", "rep movsb", "cld",
                 inout("rdi") dst.add(n - 1) => _, inout("rsi") src.add(n - 1) => _,
                 inout("rcx") n => _, options(nostack));
        }
        dst
    }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees a valid range of n bytes.
    unsafe {
        asm!("rep stosb", inout("rdi") dst => _, inout("rcx") n => _, in("al") c as u8,
             options(nostack, preserves_flags));
    }
    dst
}

#[unsafe(no_mangle)]
unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        // SAFETY: the caller guarantees both ranges are n bytes.
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return x as i32 - y as i32;
        }
    }
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: same contract as memcmp.
    unsafe { memcmp(a, b, n) }
}

/// Never called: panics abort. `libcore` is prebuilt with unwind tables that name it.
#[unsafe(no_mangle)]
extern "C" fn rust_eh_personality() {}
