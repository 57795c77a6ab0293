/* The C tests' check of one call: its status, and words its message must hold (NULL: any).
 * Each test program includes it once, after pybridge.h, and reports `failures` at the end. */
#ifndef PYBRIDGE_TESTS_EXPECT_H
#define PYBRIDGE_TESTS_EXPECT_H

#include <stdio.h>
#include <string.h>

static int failures = 0;

static void expect(const char *what, int got, int want, const char *text) {
    const char *msg = pb_last_error();
    if (got != want || (text && !strstr(msg, text))) {
        printf("FAIL %s: got %s (%s), want %s containing \"%s\"\n", what, pb_status_name(got), msg,
               pb_status_name(want), text ? text : "");
        failures++;
    } else {
        printf("ok   %s -> %s%s%s\n", what, pb_status_name(got), want ? ": " : "", want ? msg : "");
    }
}

#endif
