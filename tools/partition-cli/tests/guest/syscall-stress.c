/*
 * syscall-stress: the Linux guest's side of the SYSCALL canary (tests/linux_kernel.rs;
 * the probe guest has its own, tools/probe-guest/src/canary.rs). Built static by the test
 * with the host's gcc and run by the guest's init while it reads and writes its disk.
 *
 *   syscall-stress SECONDS
 *
 * Four workers each make system calls for SECONDS (at least one each): before each one RBX, RBP, R12-R15,
 * XMM0-15, MXCSR, the x87 control word and the 128-byte red zone below RSP get a fresh
 * pattern and DF is set; after it every one must be as it was. A 1 kHz SIGALRM interrupts
 * them all along (its handler makes a system call of its own), and a fifth process forks
 * and execs `busybox true` over and over. Prints
 *   PARTITION-STRESS calls=N mismatches=M signals=S execs=E
 * and exits 0 only if every worker finished with no mismatch.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct state {
    unsigned long gpr[6];       /* 0: rbx rbp r12 r13 r14 r15 */
    unsigned long xmm[32];      /* 48 */
    unsigned int mxcsr, fcw;    /* 304, 308 */
    unsigned long red[16];      /* 312 */
    unsigned long rflags;       /* 440 */
    unsigned long rsp_before;   /* 448 */
    unsigned long rsp_after;    /* 456 */
};

struct state stress_in, stress_out;
static volatile unsigned long signals;

void stress_call(void);
__asm__(
    ".text\n"
    ".globl stress_call\n"
    "stress_call:\n"
    "  push %rbx\n push %rbp\n push %r12\n push %r13\n push %r14\n push %r15\n"
    "  lea stress_in(%rip), %rdi\n"
    "  ldmxcsr 304(%rdi)\n"
    "  fldcw 308(%rdi)\n"
    "  movdqu 48(%rdi), %xmm0\n  movdqu 64(%rdi), %xmm1\n  movdqu 80(%rdi), %xmm2\n"
    "  movdqu 96(%rdi), %xmm3\n  movdqu 112(%rdi), %xmm4\n  movdqu 128(%rdi), %xmm5\n"
    "  movdqu 144(%rdi), %xmm6\n  movdqu 160(%rdi), %xmm7\n  movdqu 176(%rdi), %xmm8\n"
    "  movdqu 192(%rdi), %xmm9\n  movdqu 208(%rdi), %xmm10\n  movdqu 224(%rdi), %xmm11\n"
    "  movdqu 240(%rdi), %xmm12\n  movdqu 256(%rdi), %xmm13\n  movdqu 272(%rdi), %xmm14\n"
    "  movdqu 288(%rdi), %xmm15\n"
    "  xor %ecx, %ecx\n"
    "1: mov 312(%rdi,%rcx,8), %rax\n  mov %rax, -128(%rsp,%rcx,8)\n"
    "  inc %ecx\n  cmp $16, %ecx\n  jb 1b\n"
    "  lea stress_out(%rip), %rax\n  mov %rsp, 448(%rax)\n"
    "  mov 0(%rdi), %rbx\n  mov 8(%rdi), %rbp\n  mov 16(%rdi), %r12\n"
    "  mov 24(%rdi), %r13\n  mov 32(%rdi), %r14\n  mov 40(%rdi), %r15\n"
    "  std\n"
    "  mov $39, %eax\n"      /* getpid */
    "  syscall\n"
    "  lea stress_out(%rip), %rdi\n"
    "  mov %rsp, 456(%rdi)\n"
    "  mov %rbx, 0(%rdi)\n  mov %rbp, 8(%rdi)\n  mov %r12, 16(%rdi)\n"
    "  mov %r13, 24(%rdi)\n  mov %r14, 32(%rdi)\n  mov %r15, 40(%rdi)\n"
    "  movdqu %xmm0, 48(%rdi)\n  movdqu %xmm1, 64(%rdi)\n  movdqu %xmm2, 80(%rdi)\n"
    "  movdqu %xmm3, 96(%rdi)\n  movdqu %xmm4, 112(%rdi)\n  movdqu %xmm5, 128(%rdi)\n"
    "  movdqu %xmm6, 144(%rdi)\n  movdqu %xmm7, 160(%rdi)\n  movdqu %xmm8, 176(%rdi)\n"
    "  movdqu %xmm9, 192(%rdi)\n  movdqu %xmm10, 208(%rdi)\n  movdqu %xmm11, 224(%rdi)\n"
    "  movdqu %xmm12, 240(%rdi)\n  movdqu %xmm13, 256(%rdi)\n  movdqu %xmm14, 272(%rdi)\n"
    "  movdqu %xmm15, 288(%rdi)\n"
    "  stmxcsr 304(%rdi)\n  fnstcw 308(%rdi)\n"
    "  xor %ecx, %ecx\n"
    "2: mov -128(%rsp,%rcx,8), %rax\n  mov %rax, 312(%rdi,%rcx,8)\n"
    "  inc %ecx\n  cmp $16, %ecx\n  jb 2b\n"
    "  pushfq\n  popq 440(%rdi)\n  cld\n"
    "  movl $0x1f80, -8(%rsp)\n  ldmxcsr -8(%rsp)\n"
    "  movw $0x37f, -8(%rsp)\n  fldcw -8(%rsp)\n"
    "  pop %r15\n pop %r14\n pop %r13\n pop %r12\n pop %rbp\n pop %rbx\n"
    "  ret\n");

static unsigned long next(unsigned long *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* When this worker's alarms stop. */
static double deadline;

static void on_alarm(int sig)
{
    (void)sig;
    getppid();
    signals++;
    /* Past the deadline, no more alarms: where guest ring 0 is emulated (the nested host)
       a signal's delivery and handler can take longer than the 1 ms period, and a worker
       would then never get back to its loop to see the time (a 0.2 s stress ran for over
       10 minutes so). */
    if (now() >= deadline) {
        struct itimerval off = { { 0, 0 }, { 0, 0 } };
        setitimer(ITIMER_REAL, &off, NULL);
    }
}

/* One worker: calls until `seconds` have passed; writes "calls mismatches signals". */
static void worker(int id, double seconds, int out)
{
    unsigned long x = 0x5359534341525321ul ^ (unsigned long)id << 32, calls = 0, bad = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = { { 0, 1000 }, { 0, 1000 } };
    double end = now() + seconds;
    deadline = end;
    setitimer(ITIMER_REAL, &it, NULL);
    do {
        struct state want;
        memset(&want, 0, sizeof want);
        for (int i = 0; i < 6; i++)
            want.gpr[i] = next(&x);
        for (int i = 0; i < 32; i++)
            want.xmm[i] = next(&x);
        want.mxcsr = 0x7f80 | (next(&x) & 0x3f);
        want.fcw = 0x077f;
        for (int i = 0; i < 16; i++)
            want.red[i] = next(&x);
        stress_in = want;
        stress_call();
        struct state got = stress_out;
        calls++;
        int ok = !memcmp(got.gpr, want.gpr, sizeof want.gpr)
            && !memcmp(got.xmm, want.xmm, sizeof want.xmm)
            && got.mxcsr == want.mxcsr && (got.fcw & 0xffff) == want.fcw
            && !memcmp(got.red, want.red, sizeof want.red)
            && got.rsp_after == got.rsp_before && (got.rflags & 0x400);
        if (!ok) {
            if (bad < 4)
                fprintf(stderr, "PARTITION-STRESS-MISMATCH worker=%d call=%lu\n", id, calls);
            bad++;
        }
    } while (now() < end);
    struct itimerval off = { { 0, 0 }, { 0, 0 } };
    setitimer(ITIMER_REAL, &off, NULL);
    dprintf(out, "%lu %lu %lu\n", calls, bad, (unsigned long)signals);
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    int pipes[4][2];
    pid_t pids[4];
    for (int w = 0; w < 4; w++) {
        if (pipe(pipes[w]) || (pids[w] = fork()) < 0)
            return 2;
        if (pids[w] == 0) {
            close(pipes[w][0]);
            worker(w, seconds, pipes[w][1]);
            _exit(0);
        }
        close(pipes[w][1]);
    }
    /* Fork and exec churn beside them. */
    unsigned long execs = 0;
    double end = now() + seconds;
    while (now() < end) {
        pid_t p = fork();
        if (p == 0) {
            execl("/bin/busybox", "true", (char *)NULL);
            _exit(127);
        }
        int st;
        if (p > 0 && waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0)
            execs++;
    }
    unsigned long calls = 0, bad = 0, sigs = 0;
    int failed = 0;
    for (int w = 0; w < 4; w++) {
        char buf[128] = { 0 };
        ssize_t n = read(pipes[w][0], buf, sizeof buf - 1);
        unsigned long c = 0, b = 0, s = 0;
        int st;
        if (n <= 0 || sscanf(buf, "%lu %lu %lu", &c, &b, &s) != 3)
            failed = 1;
        if (waitpid(pids[w], &st, 0) != pids[w] || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed = 1;
        calls += c;
        bad += b;
        sigs += s;
    }
    printf("PARTITION-STRESS calls=%lu mismatches=%lu signals=%lu execs=%lu\n", calls, bad,
           sigs, execs);
    return failed || bad ? 1 : 0;
}
