/* The compiled model (.mote, embedded from flash) run through mote's C API
   on mps2-an386: for each input of input.bin in turn, prints each output as
   "output <i>: <int8 values>" and the top-1 class, then exits 0 (1 with the error on failure). */
#include <stddef.h>
#include <stdint.h>

#include "mote.h"
#include "semihost.h"

#ifndef ARENA_BYTES
#error "define ARENA_BYTES (the model's arena size: ARENA_BYTES in the --emit-rust module)"
#endif

extern const uint8_t mote_model_data[], mote_model_end[];
extern const uint8_t mote_input_data[], mote_input_end[];

/* The arena: sized at build time, as a TFLM tensor arena is. */
static uint8_t arena[ARENA_BYTES];

/* Reports a failed call, or a status other than the one expected. */
static int fail(const char *what, mote_status_t st)
{
    sh_puts("error: ");
    sh_puts(what);
    sh_puts(": ");
    sh_puts(mote_error_string(st));
    sh_puts("\n");
    return 1;
}

int main(void)
{
    size_t model_len = (size_t)(mote_model_end - mote_model_data);
    size_t input_len = (size_t)(mote_input_end - mote_input_data);
    size_t need = 0;
    mote_status_t st = mote_model_arena_bytes(mote_model_data, model_len, &need);
    if (st != MOTE_OK)
        return fail("model", st);
    sh_puts("model ");
    sh_put_int((long)model_len);
    sh_puts(" bytes, arena ");
    sh_put_int((long)need);
    sh_puts(" of ");
    sh_put_int((long)sizeof arena);
    sh_puts(" bytes\n");

    /* The error paths: a session never initialized, an arena one byte
       short (which leaves the session unusable). */
    mote_session_t bad = {{0}};
    if (mote_invoke(&bad) != MOTE_ERR_SESSION)
        return fail("invoke on a zeroed session did not report", MOTE_ERR_SESSION);
    if (mote_session_init(&bad, mote_model_data, model_len, arena, need - 1) != MOTE_ERR_ARENA_TOO_SMALL)
        return fail("init with a short arena did not report", MOTE_ERR_ARENA_TOO_SMALL);
    if (mote_invoke(&bad) != MOTE_ERR_SESSION)
        return fail("invoke after a failed init did not report", MOTE_ERR_SESSION);
    sh_puts("error paths: ");
    sh_puts(mote_error_string(MOTE_ERR_SESSION));
    sh_puts(", ");
    sh_puts(mote_error_string(MOTE_ERR_ARENA_TOO_SMALL));
    sh_puts("\n");

    mote_session_t s;
    st = mote_session_init(&s, mote_model_data, model_len, arena, sizeof arena);
    if (st != MOTE_OK)
        return fail("mote_session_init", st);
    uint8_t *in;
    size_t in_len;
    st = mote_input(&s, 0, &in, &in_len);
    if (st != MOTE_OK)
        return fail("mote_input", st);
    if (in_len == 0 || input_len % in_len != 0) {
        sh_puts("error: input.bin is not a whole number of the model's inputs\n");
        return 1;
    }
    size_t n = 0;
    st = mote_num_outputs(&s, &n);
    if (st != MOTE_OK)
        return fail("mote_num_outputs", st);
    for (size_t x = 0; x < input_len; x += in_len) {
        st = mote_set_input(&s, 0, mote_input_data + x, in_len);
        if (st != MOTE_OK)
            return fail("mote_set_input", st);
        st = mote_invoke(&s);
        if (st != MOTE_OK)
            return fail("mote_invoke", st);
        for (size_t i = 0; i < n; i++) {
            const uint8_t *out;
            size_t len;
            st = mote_output(&s, i, &out, &len);
            if (st != MOTE_OK)
                return fail("mote_output", st);
            sh_puts("output ");
            sh_put_int((long)i);
            sh_puts(":");
            size_t top = 0;
            for (size_t k = 0; k < len; k++) {
                sh_puts(" ");
                sh_put_int((int8_t)out[k]);
                if ((int8_t)out[k] > (int8_t)out[top])
                    top = k;
            }
            sh_puts("\ntop1 ");
            sh_put_int((long)top);
            sh_puts("\n");
        }
    }
    return 0;
}

void mote_panic_handler(void)
{
    sh_puts("mote panicked\n");
    sh_exit(101);
}
