/* Startup for mps2-an386 (Cortex-M4F): vector table, reset handler
   (FPU on, .data copied from flash, .bss zeroed, main, exit through
   semihosting), fault handlers that report and exit. */
#include <stdint.h>

#include "semihost.h"

extern uint32_t _sidata, _sdata, _edata, _sbss, _ebss, _estack;
int main(void);

#define SYS_OPEN 0x01
#define SYS_WRITE 0x05
#define SYS_EXIT_EXTENDED 0x20
#define ADP_STOPPED_APPLICATION_EXIT 0x20026

static int semihost(int op, const void *arg)
{
    register int r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

/* Console output through SYS_WRITE to ":tt" opened for writing (the
   host's stdout; SYS_WRITE0 goes to QEMU's stderr). */
void sh_puts(const char *s)
{
    static int tt = -1;
    if (tt < 0) {
        const uint32_t open[3] = {(uint32_t)":tt", 4 /* "w" */, 3 /* strlen(":tt") */};
        tt = semihost(SYS_OPEN, open);
        if (tt < 0)
            return;
    }
    uint32_t len = 0;
    while (s[len])
        len++;
    const uint32_t write[3] = {(uint32_t)tt, (uint32_t)s, len};
    semihost(SYS_WRITE, write);
}

void sh_put_int(long v)
{
    char buf[24];
    char *p = buf + sizeof buf;
    unsigned long u = v < 0 ? 0ul - (unsigned long)v : (unsigned long)v;
    *--p = 0;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    sh_puts(p);
}

void sh_exit(int status)
{
    /* The extended call passes the status (plain SYS_EXIT on 32-bit ARM
       only tells success from failure). */
    uint32_t block[2] = {ADP_STOPPED_APPLICATION_EXIT, (uint32_t)status};
    semihost(SYS_EXIT_EXTENDED, block);
    for (;;) {
    }
}

void Reset_Handler(void)
{
    /* The library is built for the hard-float ABI: enable CP10/CP11. */
    *(volatile uint32_t *)0xE000ED88 |= 0xFu << 20;
    __asm__ volatile("dsb\n\tisb" ::: "memory");
    for (uint32_t *src = &_sidata, *dst = &_sdata; dst < &_edata;)
        *dst++ = *src++;
    for (uint32_t *dst = &_sbss; dst < &_ebss;)
        *dst++ = 0;
    sh_exit(main());
}

static void fault(void)
{
    sh_puts("fault\n");
    sh_exit(3);
}

__attribute__((section(".isr_vector"), used)) static void (*const vectors[16])(void) = {
    (void (*)(void))(&_estack), Reset_Handler,
    fault, /* NMI */
    fault, /* HardFault */
    fault, /* MemManage */
    fault, /* BusFault */
    fault, /* UsageFault */
    0, 0, 0, 0,
    fault, /* SVCall */
    fault, /* DebugMonitor */
    0,
    fault, /* PendSV */
    fault, /* SysTick */
};
