# Ring 0 of the probe guest: entry points, descriptor tables, the AP trampoline, interrupt
# stubs and a handful of privileged services for ring 3.
#
# Every instruction here runs in the nested KVM's instruction emulator on the development
# hosts (about 0.7 us each, and it rejects int3, int n, xsave, rdtscp, AVX, ...), so this
# file stays small and plain: moves, port I/O, control registers, MSRs, lgdt/lidt/ltr,
# lretq/iretq, sti/hlt. Everything else runs in ring 3, natively.

    .set KSTACK_SHIFT, 13          # 8 KiB ring-0 stack per CPU
    .set USTACK_SHIFT, 14          # 16 KiB ring-3 stack per CPU
    .set MAX_CPUS, 64
    .set TSS_SHIFT, 7              # 128 bytes per TSS slot
    .set TRAMP, 0x1000             # AP trampoline page (SIPI vector 0x01)
    .set TP, 0xf00                 # parameter block inside the trampoline page
    .set TP_GDTR, TP + 0x00
    .set TP_CR3, TP + 0x10
    .set TP_ENTRY, TP + 0x18
    .set TP_CPU, TP + 0x20
    .set SEL_KCODE, 0x08
    .set SEL_KDATA, 0x10
    .set SEL_KCODE32, 0x18
    .set SEL_UDATA, 0x23
    .set SEL_UCODE, 0x2b
    .set SEL_TSS0, 0x30
    .set COM1, 0x3f8
    .set EXIT_PORT, 0xf4
    .set SYS_COUNT, 20
    .set VEC_PING, 0x40
    .set VEC_PONG, 0x41
    .set VEC_TIMER, 0x42
    .set VEC_ASSIST, 0x43          # `int $VEC_ASSIST` in the assist check (assist.rs)
    .set SUPER_ALIAS, 0x10000000000 # supervisor-only alias of the first GiB (PML4 entry 2)

# Our 64-bit GDT and its segments: CS through a far return, the data selectors, FS and GS
# null. Needs a stack; clobbers RAX.
    .macro load_gdt64
    lgdt gdtr64(%rip)
    pushq $SEL_KCODE
    lea 1f(%rip), %rax
    pushq %rax
    lretq
1:
    mov $SEL_KDATA, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    xor %eax, %eax
    mov %ax, %fs
    mov %ax, %gs
    .endm

# ---------------------------------------------------------------------------------------
# PVH entry note: XEN_ELFNOTE_PHYS32_ENTRY.
    .section .note.Xen, "a"
    .balign 4
    .long 4
    .long 4
    .long 18
    .asciz "Xen"
    .long pvh_entry32

# ---------------------------------------------------------------------------------------
    .section .text.boot, "ax"

# Linux x86-64 boot protocol: long mode, RSI = boot_params.
    .code64
    .global _start64
_start64:
    cli
    xor %edi, %edi                 # boot kind 0: linux64
    jmp bsp64

# PVH: 32-bit protected mode, paging off, EBX = hvm_start_info.
    .code32
    .global pvh_entry32
pvh_entry32:
    cli
    mov %ebx, %esi
    mov $1, %edi                   # boot kind 1: pvh
    lgdt gdtr32
    mov $SEL_KDATA, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    mov %cr4, %eax
    or $0x6a0, %eax                # PAE PGE OSFXSR OSXMMEXCPT
    mov %eax, %cr4
    mov $pml4, %eax
    mov %eax, %cr3
    mov $0xc0000080, %ecx
    rdmsr
    or $0x900, %eax                # LME NXE
    wrmsr
    mov %cr0, %eax
    or $0x80010023, %eax           # PG WP NE MP PE
    and $0x9ffffffb, %eax          # EM, NW, CD off
    mov %eax, %cr0
    ljmp $SEL_KCODE, $pvh_long
    .code64
pvh_long:
    mov %esi, %esi
    jmp bsp64

# Bootstrap processor, 64-bit, any GDT: take over the machine and drop to ring 3.
bsp64:
    lea kstacks + (1 << KSTACK_SHIFT)(%rip), %rsp
    load_gdt64
    lea pml4(%rip), %rax
    mov %rax, %cr3
    mov %cr4, %rax
    or $0x6a0, %rax
    mov %rax, %cr4
    mov %cr0, %rax
    and $0xffffffff9ffffffb, %rax  # EM, NW, CD off
    or $0x22, %rax
    mov %rax, %cr0
    mov $0xff, %al                 # mask both 8259s
    out %al, $0x21
    out %al, $0xa1
    xor %ecx, %ecx
    lea user_bsp_start(%rip), %rdx
    jmp cpu_init

# Application processors arrive here from the trampoline, RCX = CPU index.
    .global ap_entry64
ap_entry64:
    mov %rcx, %rax
    inc %rax
    shl $KSTACK_SHIFT, %rax
    lea kstacks(%rip), %rsp
    add %rax, %rsp
    load_gdt64
    mov %rcx, %rdi
    lea user_ap_start(%rip), %rdx
    jmp cpu_init

# Per-CPU setup. RCX = CPU index, RDX = ring-3 entry, RDI/RSI = its arguments.
cpu_init:
    mov %rcx, %rax
    inc %rax
    shl $KSTACK_SHIFT, %rax
    lea kstacks(%rip), %rsp
    add %rax, %rsp
    mov %rcx, %rax
    shl $TSS_SHIFT, %rax
    lea tss_array(%rip), %r8
    add %rax, %r8                  # r8 = this CPU's TSS
    mov %rsp, 4(%r8)               # RSP0
    movw $104, 102(%r8)            # no I/O bitmap
    mov %r8, %rax                  # descriptor low: limit, base 23:0, type 9, P, base 31:24
    and $0xffffff, %rax
    shl $16, %rax
    or $0x67, %rax
    mov $0x89, %r9
    shl $40, %r9
    or %r9, %rax
    mov %r8, %r9
    shr $24, %r9
    and $0xff, %r9
    shl $56, %r9
    or %r9, %rax
    mov %rcx, %r9
    shl $4, %r9
    lea gdt_tss(%rip), %r10
    add %r9, %r10
    mov %rax, (%r10)
    mov %r8, %rax
    shr $32, %rax
    mov %rax, 8(%r10)
    mov %rcx, %rax
    shl $4, %rax
    add $SEL_TSS0, %rax
    ltr %ax
    lidt idtr(%rip)
    mov %rcx, %rax
    inc %rax
    shl $USTACK_SHIFT, %rax
    lea ustacks(%rip), %r8
    add %r8, %rax
    pushq $SEL_UDATA
    pushq %rax
    pushq $0x3002                  # IOPL 3 (ring 3 may use port I/O); interrupts stay off
                                   # until ring 3 has filled the IDT
    pushq $SEL_UCODE
    pushq %rdx
    iretq

# ---------------------------------------------------------------------------------------
# AP trampoline, copied to TRAMP by the BSP; entered in real mode at TRAMP.
    .code16
    .global tramp_start
tramp_start:
    cli
    mov %cs, %ax
    mov %ax, %ds
    lgdtl TP_GDTR
    mov %cr0, %eax
    or $1, %eax
    mov %eax, %cr0
    ljmpl $SEL_KCODE32, $(TRAMP + tramp32 - tramp_start)
    .code32
tramp32:
    mov $SEL_KDATA, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    mov %cr4, %eax
    or $0x6a0, %eax
    mov %eax, %cr4
    mov (TRAMP + TP_CR3), %eax
    mov %eax, %cr3
    mov $0xc0000080, %ecx
    rdmsr
    or $0x900, %eax
    wrmsr
    mov %cr0, %eax
    or $0x80010023, %eax
    and $0x9ffffffb, %eax          # EM, NW, CD off (an AP leaves INIT with caches off)
    mov %eax, %cr0
    ljmp $SEL_KCODE, $(TRAMP + tramp64 - tramp_start)
    .code64
tramp64:
    mov (TRAMP + TP_CPU), %rcx
    mov (TRAMP + TP_ENTRY), %rax
    jmp *%rax
    .global tramp_end
tramp_end:

# ---------------------------------------------------------------------------------------
# Interrupt stubs: 256 of them, 16 bytes apart, so ring 3 can fill the IDT by arithmetic.
    .code64
    .balign 16
    .global isr_stubs
isr_stubs:
    .set vec, 0
    .rept 256
    .balign 16
    .if vec == 6
    jmp ud_entry
    .else
    .if (vec == 8) || ((vec >= 10) && (vec <= 14)) || (vec == 17) || (vec == 21) || (vec == 29) || (vec == 30)
    .else
    pushq $0
    .endif
    pushq $vec
    .if vec < 32
    jmp exc_common
    .else
    jmp irq_common
    .endif
    .endif
    .set vec, vec + 1
    .endr

# #UD: a `ud2` executed in ring 3 is a service call (the nested host's emulator rejects
# `int n`, and SYSCALL/LSTAR is broken there); any other #UD is fatal.
ud_entry:
    testb $3, 8(%rsp)
    jz 1f
    push %r11
    mov 8(%rsp), %r11
    cmpw $0x0b0f, (%r11)
    pop %r11
    jne 1f
    addq $2, (%rsp)
    jmp syscall_entry
1:
    pushq $0
    pushq $6
    jmp exc_common

# Device and IPI interrupts: count, EOI (not for the spurious vector 0xff), return.
irq_common:
    push %rax
    push %rdx
    mov 16(%rsp), %rax
    lea irq_counts(%rip), %rdx
    incq (%rdx,%rax,8)
    cmp $VEC_ASSIST, %rax          # `int $VEC_ASSIST`: note where it returned
    jne 2f
    mov 32(%rsp), %rdx
    mov %rdx, assist_rips + 8(%rip)
2:
    cmp $0xff, %rax
    je 1f
    mov $0xfee000b0, %edx
    movl $0, (%rdx)
1:
    pop %rdx
    pop %rax
    add $16, %rsp
    iretq

# CPU exceptions are fatal: say which, where, and power off with status 3. One is
# expected: a #GP at pio_try_insn (ring 3 tried port I/O and the hypervisor refused IOPL 3)
# resumes at pio_try_fixup.
exc_common:
    cmpq $3, (%rsp)                # #BP: an int3 (the assist check); note where it returned
    jne 3f
    push %rax
    mov 24(%rsp), %rax
    mov %rax, assist_rips(%rip)
    pop %rax
    add $16, %rsp
    iretq
3:
    cmpq $14, (%rsp)               # #PF at pf_try_insn (canary.rs: an ordinary user page
    jne 4f                         # fault) resumes at pf_try_fixup, and is counted
    push %rax
    lea pf_try_insn(%rip), %rax
    cmp %rax, 24(%rsp)
    jne 2f
    lea pf_try_fixup(%rip), %rax
    mov %rax, 24(%rsp)
    incq pf_seen(%rip)
    pop %rax
    add $16, %rsp
    iretq
4:
    cmpq $13, (%rsp)
    jne 1f
    push %rax
    lea pio_try_insn(%rip), %rax
    cmp %rax, 24(%rsp)
    jne 2f
    lea pio_try_fixup(%rip), %rax
    mov %rax, 24(%rsp)
    pop %rax
    add $16, %rsp
    iretq
2:
    pop %rax
1:
    lea msg_exc(%rip), %rsi
    call r0_puts
    mov (%rsp), %rax
    call r0_puthex
    lea msg_err(%rip), %rsi
    call r0_puts
    mov 8(%rsp), %rax
    call r0_puthex
    lea msg_rip(%rip), %rsi
    call r0_puts
    mov 16(%rsp), %rax
    call r0_puthex
    lea msg_cr2(%rip), %rsi
    call r0_puts
    mov %cr2, %rax
    call r0_puthex
    lea msg_nl(%rip), %rsi
    call r0_puts
    mov $3, %al
    out %al, $EXIT_PORT
2:
    cli
    hlt
    jmp 2b

r0_puts:
    mov $COM1, %dx
1:
    lodsb
    test %al, %al
    jz 2f
    out %al, %dx
    jmp 1b
2:
    ret

r0_puthex:
    mov %rax, %r10
    mov $COM1, %dx
    mov $16, %ecx
    lea hexdigits(%rip), %r9
1:
    rol $4, %r10
    mov %r10, %r8
    and $0xf, %r8
    movb (%r9,%r8,1), %al
    out %al, %dx
    dec %ecx
    jnz 1b
    ret

# ---------------------------------------------------------------------------------------
# Services for ring 3: `ud2`, RAX = service, RDI/RSI/RDX = arguments, RAX = result.
syscall_entry:
    cmp $SYS_COUNT, %rax
    jae sys_bad
    push %rbx
    lea systab(%rip), %r11
    jmp *(%r11,%rax,8)
sys_ret:
    pop %rbx
    iretq
sys_bad:
    mov $-1, %rax
    iretq

sys_outb:
    mov %edi, %edx
    mov %esi, %eax
    out %al, %dx
    jmp sys_ret
sys_null:                          # the dispatch alone (the paths benchmark subtracts it)
    jmp sys_ret
sys_inb:
    mov %edi, %edx
    xor %eax, %eax
    in %dx, %al
    jmp sys_ret
sys_outsb:                         # RDI = buffer, RSI = length, RDX = port
    mov %rsi, %rcx
    mov %rdi, %rsi
    cld
    rep outsb (%rsi), %dx
    jmp sys_ret
sys_halt:                          # wait for an interrupt
    sti
    hlt
    cli
    jmp sys_ret
sys_wrmsr:
    mov %edi, %ecx
    mov %rsi, %rax
    mov %rsi, %rdx
    shr $32, %rdx
    wrmsr
    jmp sys_ret
sys_rdmsr:
    mov %edi, %ecx
    rdmsr
    shl $32, %rdx
    or %rdx, %rax
    jmp sys_ret
sys_cpuid:                         # RDI = leaf, RSI = subleaf, RDX = &[u32; 4]
    mov %rdx, %r8
    mov %edi, %eax
    mov %esi, %ecx
    cpuid
    mov %eax, (%r8)
    mov %ebx, 4(%r8)
    mov %ecx, 8(%r8)
    mov %edx, 12(%r8)
    jmp sys_ret
# XSETBV and XGETBV, for the XSAVE consistency check (probe.xsave=1; never on the nested
# host, whose emulator refuses both): CR4.OSXSAVE set, XCR0 = RDI, -> XCR0 read back.
sys_xsetbv:
    mov %cr4, %rax
    or $0x40000, %rax
    mov %rax, %cr4
    mov %edi, %eax
    mov %rdi, %rdx
    shr $32, %rdx
    xor %ecx, %ecx
    xsetbv
    xor %ecx, %ecx
    xgetbv
    shl $32, %rdx
    or %rdx, %rax
    jmp sys_ret
sys_setif:                         # RDI != 0: interrupts on in ring 3
    test %rdi, %rdi
    jz 1f
    orq $0x200, 24(%rsp)
    jmp sys_ret
1:
    andq $0xfffffffffffffdff, 24(%rsp)
    jmp sys_ret
sys_stop:
    cli
1:
    hlt
    jmp 1b
sys_outl:
    mov %edi, %edx
    mov %esi, %eax
    out %eax, %dx
    jmp sys_ret
sys_inl:
    mov %edi, %edx
    in %dx, %eax
    jmp sys_ret
sys_outw:
    mov %edi, %edx
    mov %esi, %eax
    out %ax, %dx
    jmp sys_ret
sys_inw:
    mov %edi, %edx
    xor %eax, %eax
    in %dx, %ax
    jmp sys_ret

# Idle waits. Interrupts are off in ring 0 (the #UD gate clears IF) except inside
# `sti; hlt` / `sti; mwait`, where STI's one-instruction shadow makes the check and the wait
# atomic: an interrupt that arrived before is still pending and ends the wait at once.
#
# r0_wait: RDI = address of a u64, RSI = its old value, R9 = mode (0 hlt, 1 mwait).
# Returns the TSC at wake-up in RAX. Clobbers RCX, RDX.
r0_wait:
1:
    cmp (%rdi), %rsi
    jne 3f
    test %r9, %r9
    jnz 2f
    sti
    hlt
    cli
    jmp 1b
2:
    mov %rdi, %rax
    xor %ecx, %ecx
    xor %edx, %edx
    monitor
    cmp (%rdi), %rsi
    jne 3f
    xor %eax, %eax
    xor %ecx, %ecx
    sti
    mwait
    cli
    jmp 1b
3:
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    ret

# The instructions this host's emulator refuses in ring 0 and the VMM assists (see
# partition/src/assist.rs): int3 and int n (their handlers note the address they return
# to in assist_rips), fwait, and ldmxcsr from RDI. RAX = 0.
    .global assist_after_int3, assist_after_int_n
sys_assist:
    int3
assist_after_int3:
    int $VEC_ASSIST
assist_after_int_n:
    fwait
    ldmxcsr (%rdi)
    xor %eax, %eax
    jmp sys_ret

sys_wait:                          # RDI = address, RSI = old value, RDX = mode -> TSC
    mov %rdx, %r9
    call r0_wait
    jmp sys_ret

# Waits until either of two u64 words moves: RDI = first address, RSI = its old value,
# RDX = second address | mwait (bit 0; the words are 8-byte aligned), whose old value is
# read first thing (the caller read both just before). Hlt, or monitor/mwait on the first
# word; any interrupt ends either, and the words are checked again. -> TSC.
sys_wait2:
    mov %rdx, %r9
    and $1, %r9                    # mwait?
    mov %rdx, %r8
    and $-2, %r8                   # second address
    mov (%r8), %r10                # its old value
1:
    cmp (%rdi), %rsi
    jne 3f
    cmp (%r8), %r10
    jne 3f
    test %r9, %r9
    jnz 2f
    sti
    hlt
    cli
    jmp 1b
2:
    mov %rdi, %rax
    xor %ecx, %ecx
    xor %edx, %edx
    monitor
    cmp (%rdi), %rsi
    jne 3f
    cmp (%r8), %r10
    jne 3f
    xor %eax, %eax
    xor %ecx, %ecx
    sti
    mwait
    cli
    jmp 1b
3:
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    jmp sys_ret

# IPI ping-pong, both sides in ring 0. RDI = iterations, RSI = peer APIC ID << 24,
# RDX = flags: bit 0 mwait (else hlt), bit 1 initiator (else responder). The initiator
# sends PING and waits for PONG, storing each round trip (TSC cycles) in wake_samples;
# the responder waits for PING and answers PONG.
#
# The IPI is a doorbell, not the message: round r is published in wake_rounds (PING's
# word, then PONG's) before its IPI is sent, and a side goes on only when the peer's word
# says r. A wake-up whose vector's count moved while the word did not (an interrupt
# delivered twice, or one that came after its round was already seen) waits again, so
# no round is answered twice or lost; the rounds run 1..=n from wake_rounds' values at
# the call (both sides start from the same: the BSP zeroes them before posting).
sys_pingpong:
    push %r12
    push %r13
    push %r14
    push %r15
    push %rbx
    mov %rdi, %r12
    mov %esi, %r13d
    mov %rdx, %r14
    mov %rdx, %r9
    and $1, %r9
    lea wake_samples(%rip), %r15
    xor %ebx, %ebx                 # round
1:
    inc %rbx
    test $2, %r14
    jz 2f
    lea irq_counts + VEC_PONG * 8(%rip), %rdi
    mov (%rdi), %rsi
    mov %rbx, wake_rounds(%rip)    # PING's word first, then the doorbell
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, %r11
    mov $0xfee00310, %eax
    mov %r13d, (%rax)
    mov $0xfee00300, %eax
    movl $(0x4000 | VEC_PING), (%rax)
4:
    cmp wake_rounds + 8(%rip), %rbx
    je 5f
    call r0_wait
    mov (%rdi), %rsi
    cmp wake_rounds + 8(%rip), %rbx
    je 6f
    incq wake_spurious + 8(%rip)   # PONG's count moved, its word did not
    jmp 4b
5:
    rdtsc                          # the word was there before any wait
    shl $32, %rdx
    or %rdx, %rax
6:
    sub %r11, %rax
    mov %rax, (%r15)
    add $8, %r15
    jmp 3f
2:
    lea irq_counts + VEC_PING * 8(%rip), %rdi
    mov (%rdi), %rsi
7:
    cmp wake_rounds(%rip), %rbx
    je 8f
    call r0_wait
    mov (%rdi), %rsi
    cmp wake_rounds(%rip), %rbx
    je 8f
    incq wake_spurious(%rip)       # PING's count moved, its word did not
    jmp 7b
8:
    mov %rbx, wake_rounds + 8(%rip)
    mov $0xfee00310, %eax
    mov %r13d, (%rax)
    mov $0xfee00300, %eax
    movl $(0x4000 | VEC_PONG), (%rax)
3:
    cmp %r12, %rbx
    jb 1b
    pop %rbx
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    jmp sys_ret

# TSC-deadline timer: RDI = deadline, RSI = mode. Arms IA32_TSC_DEADLINE, waits for the
# timer vector, returns the TSC at wake-up.
sys_timer_wait:                    # RDI = TSC deadline (0: ring 3 armed the timer)
    mov %rsi, %r9
    lea irq_counts + VEC_TIMER * 8(%rip), %r10
    mov (%r10), %rsi
    test %rdi, %rdi
    jz 1f
    mov $0x6e0, %ecx
    mov %rdi, %rax
    mov %rdi, %rdx
    shr $32, %rdx
    wrmsr
1:
    mov %r10, %rdi
    call r0_wait
    jmp sys_ret

# SYSCALL entry for the syscall check, reached through the supervisor-only alias at
# SUPER_ALIAS (so a SYSCALL that stays in ring 3 faults here, as Linux's entry does).
# Notes CS and the return address, returns with SYSRET.
    .global syscall_entry_probe
syscall_entry_probe:
    mov %cs, %rax
    mov %rax, syscall_seen(%rip)
    mov %rcx, syscall_seen + 8(%rip)
    incq syscall_seen + 16(%rip)
    sysretq

# SYSCALL entry of the canary (canary.rs), through the same alias. It runs with the user's
# RSP, so it takes no stack until it has its own: notes the RFLAGS and CS it runs with (an
# interrupt let in here would write below the user's RSP), counts, returns with SYSRET.
    .global canary_entry
canary_entry:
    mov %rsp, canary_user_rsp(%rip)
    lea canary_stack_top(%rip), %rsp
    pushfq
    popq canary_seen(%rip)
    mov %cs, %rax
    mov %rax, canary_seen + 8(%rip)
    incq canary_seen + 16(%rip)
    mov canary_user_rsp(%rip), %rsp
    sysretq

# ---------------------------------------------------------------------------------------
# Ring 3: `in` from port EDI, returning the byte, or -1 when ring 3 may not do port I/O
# (the #GP is turned into a return from pio_try_fixup by exc_common).
    .section .text, "ax"
    .global pio_try_inb
pio_try_inb:
    mov %edi, %edx
    xor %eax, %eax
pio_try_insn:
    in %dx, %al
    ret
pio_try_fixup:
    mov $-1, %eax
    ret

# Ring 3: read the u64 at RDI, returning it, or -1 if that page faults (exc_common turns
# the #PF at pf_try_insn into a return from pf_try_fixup and counts it in pf_seen).
    .global pf_try_read
pf_try_read:
pf_try_insn:
    mov (%rdi), %rax
    ret
pf_try_fixup:
    mov $-1, %rax
    ret

# ---------------------------------------------------------------------------------------
# Ring-3 entry stubs.
    .section .text, "ax"
user_bsp_start:
    mov %rdi, %r12
    mov %rsi, %r13
    lea __bss_start(%rip), %rdi
    lea __bss_end(%rip), %rcx
    sub %rdi, %rcx
    xor %eax, %eax
    cld
    rep stosb
    mov %r12, %rdi
    mov %r13, %rsi
    call probe_main
    ud2
user_ap_start:
    call ap_main
    ud2

# ---------------------------------------------------------------------------------------
    .section .rodata, "a"
systab:
    .quad sys_outb, sys_inb, sys_outsb, sys_halt, sys_wrmsr, sys_rdmsr, sys_cpuid
    .quad sys_setif, sys_stop, sys_outl, sys_inl, sys_outw, sys_inw
    .quad sys_wait, sys_pingpong, sys_timer_wait, sys_null, sys_assist
    .quad sys_wait2, sys_xsetbv
hexdigits:
    .ascii "0123456789abcdef"
msg_exc:
    .asciz "\nprobe: FATAL cpu exception vector=0x"
msg_err:
    .asciz " error=0x"
msg_rip:
    .asciz " rip=0x"
msg_cr2:
    .asciz " cr2=0x"
msg_nl:
    .asciz "\n"

    .section .data, "aw"
    .balign 16
    .global gdt
gdt:
    .quad 0
    .quad 0x00af9b000000ffff       # 0x08 ring-0 code, 64-bit
    .quad 0x00cf93000000ffff       # 0x10 ring-0 data
    .quad 0x00cf9b000000ffff       # 0x18 ring-0 code, 32-bit (AP trampoline)
    .quad 0x00cff3000000ffff       # 0x20 ring-3 data (0x23)
    .quad 0x00affb000000ffff       # 0x28 ring-3 code, 64-bit (0x2b)
gdt_tss:
    .fill MAX_CPUS * 2, 8, 0       # 0x30 + 16 * cpu: per-CPU TSS descriptors
gdt_end:
    .global gdtr64
gdtr64:
    .word gdt_end - gdt - 1
    .quad gdt
gdtr32:
    .word gdt_end - gdt - 1
    .long gdt
idtr:
    .word 256 * 16 - 1
    .quad idt

# Identity map of 0..64 GiB with 2 MiB user-accessible pages, the 3..4 GiB MMIO hole uncached;
# 64 GiB..1 TiB with 1 GiB pages, uncached (the VMM's 64-bit BAR window, sized to the BARs:
# a GPU's VRAM aperture of up to 512 GiB, at 512 GiB).
# PML4 entry 2 maps the first GiB again at SUPER_ALIAS, supervisor only (the syscall check).
    .section .data.pagetables, "aw"
    .balign 4096
    .global pml4
pml4:
    .quad pdpt + 0x7
    .quad pdpt_high + 0x7          # 512 GiB..1 TiB
    .quad pdpt_super + 0x3         # SUPER_ALIAS: the first GiB again, supervisor only
    .fill 509, 8, 0
pdpt_high:
    .set i, 512
    .rept 512
    .quad (i << 30) | 0x9f
    .set i, i + 1
    .endr
pdpt_super:
    .quad pd_super + 0x3
    .fill 511, 8, 0
pd_super:
    .set i, 0
    .rept 512
    .quad (i << 21) | 0x83
    .set i, i + 1
    .endr
pdpt:
    .set i, 0
    .rept 64
    .quad pd + i * 4096 + 0x7
    .set i, i + 1
    .endr
    # 64..512 GiB, the VMM's 64-bit BAR window: 1 GiB pages, uncached (bigbar.rs checks
    # CPUID for 1 GiB pages before touching them).
    .rept 448
    .quad (i << 30) | 0x9f
    .set i, i + 1
    .endr
pd:
    .set i, 0
    .rept 64 * 512
    .if (i >= 1536) && (i < 2048)
    .quad (i << 21) | 0x9f
    .else
    .quad (i << 21) | 0x87
    .endif
    .set i, i + 1
    .endr

    .section .bss, "aw", @nobits
    .balign 64
    .global irq_counts
irq_counts:
    .skip 256 * 8
    .global assist_rips
assist_rips:
    .skip 2 * 8
    .global syscall_seen
syscall_seen:                      # CS in the entry, RCX (return address), entries
    .skip 3 * 8
    .global pf_seen
pf_seen:                           # page faults at pf_try_insn, recovered
    .skip 8
    .global canary_seen
canary_seen:                       # RFLAGS and CS in the canary's entry, entries
    .skip 3 * 8
canary_user_rsp:
    .skip 8
canary_stack:
    .skip 64
canary_stack_top:
    .global wake_samples
wake_samples:
    .skip 4096 * 8
    .balign 64
    .global wake_rounds
wake_rounds:                       # the ping-pong's round words: PING's, PONG's
    .skip 2 * 8
    .global wake_spurious
wake_spurious:                     # wake-ups on PING's, PONG's vector with no new round
    .skip 2 * 8

    .section .noinit, "aw", @nobits
    .balign 4096
    .global idt
idt:
    .skip 4096
tss_array:
    .skip MAX_CPUS << TSS_SHIFT
    .balign 4096
kstacks:
    .skip MAX_CPUS << KSTACK_SHIFT
ustacks:
    .skip MAX_CPUS << USTACK_SHIFT
