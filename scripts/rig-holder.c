/*
 * The rig's holder (scripts/rig.sh puts it in the outer machine and starts it first): one
 * VM with an in-kernel irqchip and one vCPU whose local APIC stays software-disabled,
 * alive for the whole run, doing nothing.
 *
 * Why: KVM flips static keys when the first VM appears and the last one goes (its preempt
 * notifiers, patched into __schedule) and as local APICs are enabled; the kernel patches
 * each site with an int3 first. Under QEMU's multi-threaded TCG the other CPU once ran such
 * an int3 after the patch had finished ("Oops: int3" in __schedule, the outer Linux
 * panicked). With the holder alive those keys never return to zero, so our launches never
 * patch them. docs/testing.md.
 */
#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define KVM_CREATE_VM 0xae01
#define KVM_CREATE_IRQCHIP 0xae60
#define KVM_CREATE_VCPU 0xae41

int main(void)
{
    int kvm = open("/dev/kvm", O_RDWR);
    int vm = kvm < 0 ? -1 : ioctl(kvm, KVM_CREATE_VM, 0);
    if (vm < 0 || ioctl(vm, KVM_CREATE_IRQCHIP, 0) < 0 || ioctl(vm, KVM_CREATE_VCPU, 0) < 0)
        return 1;
    for (;;)
        pause();
}
