package snowkeep

import (
	"context"
	"runtime"
	"time"
)

// clock is where the embedded generator reads time and sleeps, so tests can
// drive it (the Rust client's client/src/clock.rs plays the same part).
//
// Two clocks matter (docs/design.md, the safety invariant): the wall clock,
// which ids stamp and which may step, and the monotonic clock, which lease
// deadlines are measured by and which never steps. In Go one time.Now()
// carries both readings, so now returns them together; mono reads only the
// monotonic clock (runtime nanotime, through time.Since), the cheap reading
// the generator takes per id inside a window (see machine).
type clock interface {
	// now returns the wall clock in ns since the Unix epoch and the
	// monotonic clock (time since an origin fixed for the clock's life).
	now() (unixNs int64, mono time.Duration)
	// mono returns the monotonic clock alone, the same one now returns.
	mono() time.Duration
	// sleep waits d (at once for d <= 0) or until ctx ends (ctx.Err()).
	sleep(ctx context.Context, d time.Duration) error
}

// systemClock is the operating system's clocks.
type systemClock struct{}

// processOrigin is the origin of systemClock's monotonic readings. It holds
// a monotonic reading, so time.Since(processOrigin) reads only the
// monotonic clock.
var processOrigin = time.Now()

func (systemClock) now() (int64, time.Duration) {
	t := time.Now()
	return t.UnixNano(), t.Sub(processOrigin)
}

func (systemClock) mono() time.Duration { return time.Since(processOrigin) }

func (systemClock) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	if d <= time.Millisecond {
		// The wait for the next tick: a timer this short fires late (often a
		// whole ms), which would skip ticks at the layout's limit, so yield
		// until it has passed instead.
		until := time.Now().Add(d)
		for time.Now().Before(until) {
			if err := ctx.Err(); err != nil {
				return err
			}
			runtime.Gosched()
		}
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// offsetClock is a clock whose wall readings are shifted by offset
// (EmbeddedConfig.ClockOffset); its monotonic readings are not.
type offsetClock struct {
	clock
	offset time.Duration
}

func (c offsetClock) now() (int64, time.Duration) {
	unixNs, mono := c.clock.now()
	return unixNs + int64(c.offset), mono
}
