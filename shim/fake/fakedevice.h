/*
 * The fake driver's device model: when the work a process submits gets done.
 *
 * A "mark" names a point in one process's work: a stream's or event's tail. It is opaque to the
 * caller; marks of one process only grow, so the later of two marks is the larger.
 */
#ifndef DILU_FAKE_DEVICE_H
#define DILU_FAKE_DEVICE_H

#include <stdint.h>

/* Maps the clock file (DILU_FAKE_CLOCK, else a private clock) and reads the model's settings;
 * called once, from the driver's initialisation. */
void device_open(void);

/* Queues `duration_ns` of this process's work behind what it queued before (and, in the fifo
 * model, behind every process's); returns the mark at which it is done. Waits while this
 * process has more than its launch queue's worth of work outstanding. */
int64_t device_submit(int64_t duration_ns);

/* Whether the device has done this process's work up to `mark`. */
int device_reached(int64_t mark);

/* Sleeps until the device has done this process's work up to `mark`. */
void device_wait(int64_t mark);

/* The most work this process has had submitted and unfinished at once (right after a submit). */
int64_t device_peak_outstanding(void);

#endif
