//! The exits section's guest: an overlay on Debian's userspace initramfs (newc cpio) with
//! hotpaths in counted mode and an init that runs it, prints what the guest idles in, and
//! powers off.

use super::MARK_PORT;

/// Appends one newc cpio entry owned by root (`rdev`: a device node's major and minor).
pub fn cpio_entry(buf: &mut Vec<u8>, name: &str, mode: u32, data: &[u8], rdev: (u32, u32)) {
    let ino = buf.len() as u32 + 1;
    let header = format!(
        "070701{ino:08x}{mode:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
        0,
        0,
        1,
        0,
        data.len(),
        0,
        0,
        rdev.0,
        rdev.1,
        name.len() + 1,
        0
    );
    buf.extend_from_slice(header.as_bytes());
    buf.extend_from_slice(name.as_bytes());
    buf.push(0);
    while buf.len() % 4 != 0 {
        buf.push(0);
    }
    buf.extend_from_slice(data);
    while buf.len() % 4 != 0 {
        buf.push(0);
    }
}

/// The overlay's init: the base initramfs's mounts and modules, the disk, hotpaths in
/// counted mode, power off.
pub fn init_script(n1: u64, n2: u64, ops: &str) -> String {
    format!(
        "#!/bin/busybox sh\n\
         B=/bin/busybox\n\
         $B mount -t proc proc /proc\n\
         $B mount -t sysfs sys /sys\n\
         $B mount -t devtmpfs dev /dev\n\
         $B mkdir -p /tmp\n\
         for m in $($B cat /lib/modules/load); do $B insmod /lib/modules/$m; done\n\
         i=0\n\
         while [ ! -b /dev/vda ] && [ $i -lt 600 ]; do $B sleep 0.1; i=$((i+1)); done\n\
         r=default\n\
         $B dmesg | $B grep -q 'using mwait in idle threads' && r=mwait\n\
         $B dmesg | $B grep -q 'using polling idle threads' && r=poll\n\
         $B echo EXITS-READY cpus=$($B nproc) idle=$($B cat /sys/devices/system/cpu/cpuidle/current_driver) gov=$($B cat /sys/devices/system/cpu/cpuidle/current_governor_ro) routine=$r\n\
         /bin/hotpaths --count {n1},{n2} --mark-port {MARK_PORT:#x} --cpus 0,1 --only {ops} --blk /dev/vda --dir /tmp\n\
         $B echo EXITS-DONE rc=$?\n\
         $B grep -i -e virtio -e CPU0 -e RES: -e CAL: /proc/interrupts | while read -r l; do $B echo \"EXITS-IRQ $l\"; done\n\
         $B sleep 1\n\
         $B poweroff -f\n\
         $B reboot -f\n"
    )
}

/// The initramfs: `base` followed by an overlay with /init and /bin/hotpaths (the kernel
/// unpacks concatenated archives in order, later files replacing earlier ones).
pub fn initramfs(base: &[u8], hotpaths: &[u8], init: &str) -> Vec<u8> {
    let mut out = base.to_vec();
    while out.len() % 4 != 0 {
        out.push(0);
    }
    cpio_entry(&mut out, "bin", 0o040_755, &[], (0, 0));
    cpio_entry(&mut out, "tmp", 0o041_777, &[], (0, 0));
    cpio_entry(&mut out, "bin/hotpaths", 0o100_755, hotpaths, (0, 0));
    cpio_entry(&mut out, "init", 0o100_755, init.as_bytes(), (0, 0));
    cpio_entry(&mut out, "TRAILER!!!", 0, &[], (0, 0));
    out
}
