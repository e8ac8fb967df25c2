/* ARM semihosting (`bkpt 0xab`): console output and exit with a status. */
#ifndef SEMIHOST_H
#define SEMIHOST_H

void sh_puts(const char *s);
void sh_put_int(long v);
__attribute__((noreturn)) void sh_exit(int status);

#endif
