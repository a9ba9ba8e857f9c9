package snowkeep

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// grant is the right to stamp ids under one machine id, from the Lease API
// (docs/design.md, the safety invariant and the fence protocol).
type grant struct {
	machineID uint32
	// floor is exclusive (layout ms): the previous holders' fences; stamps
	// are ticks whose first ms is above it.
	floor uint64
	// fence is inclusive (layout ms): the fence persisted for this holder.
	fence uint64
	// deadline is the local lease deadline on the monotonic clock, counted
	// from when the request that granted it was sent.
	deadline time.Duration
}

// windowSpan is how long one wall-clock reading is stamped from, on the
// monotonic clock: 1 ms (and at most half the time left to the deadline).
// The Rust generator's WALL_READING_LASTS.
const windowSpan = time.Millisecond

// machine generates ascending ids for one held machine id: the Go port of
// the Rust Generator and its SequenceState (client/src/generator). Every
// rule of admit is checked on a wall-clock reading; a reading that issues
// opens a window of at most windowSpan in which later ids are stamped at the
// same timestamp after one monotonic reading each, under the same grant
// (publish and withdraw close it). The grant is read under mu, so once
// withdraw returned no id is stamped under the old grant by a caller of take
// ("drain before release"); a Worker's reserved run is the one exception,
// see Worker.
type machine struct {
	mu      sync.Mutex
	layout  Layout
	perTick uint64
	clk     clock
	maxBack time.Duration

	g *grant // nil: do not issue
	// epoch counts publish and withdraw calls: a Worker's run serves only
	// while it is unchanged.
	epoch atomic.Uint64

	// The cursor: the last timestamp stamped (or the floor before any
	// stamp) under curMachine, and the next free sequence in its tick
	// (perTick when used up or before any stamp).
	hasCur     bool
	curMachine uint32
	last       uint64
	nextSeq    uint64

	// The window of the last wall reading that issued: open while mono <
	// winUntil; winBase is the id of sequence 0 at last.
	winOpen  bool
	winUntil time.Duration
	winBase  uint64

	_ [64]byte // keeps two machines' locks off one cache line
}

func newMachine(l Layout, clk clock, maxBack time.Duration) *machine {
	return &machine{layout: l, perTick: l.perTick(), clk: clk, maxBack: maxBack}
}

// publish puts g in force (a fresh or renewed grant).
func (m *machine) publish(g grant) {
	m.mu.Lock()
	m.g = &g
	m.winOpen = false
	m.epoch.Add(1)
	m.mu.Unlock()
}

// withdraw stops issuance under the grant in force.
func (m *machine) withdraw() {
	m.mu.Lock()
	m.g = nil
	m.winOpen = false
	m.epoch.Add(1)
	m.mu.Unlock()
}

// drain returns the machine id in use and the last timestamp stamped on it
// (its floor before any stamp); ok is false before any grant was used. Call
// it after withdraw: the lock it takes orders it after every take.
func (m *machine) drain() (machineID uint32, last uint64, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.curMachine, m.last, m.hasCur
}

// take takes up to want ids in one step without waiting: a run of count
// consecutive ids from first (count > 0), or wait > 0 (the tick's sequence
// is used up, or the clock stepped back a little: try again after wait), or
// an error (*GenerateError).
func (m *machine) take(want uint64) (first, count uint64, wait time.Duration, err error) {
	m.mu.Lock()
	first, count, wait, err = m.takeLocked(want)
	m.mu.Unlock()
	return
}

// reserve is take for a Worker: also the end of the window the run may be
// served in and the epoch it was taken under.
func (m *machine) reserve(want uint64) (first, count uint64, wait, until time.Duration, epoch uint64, err error) {
	m.mu.Lock()
	first, count, wait, err = m.takeLocked(want)
	until, epoch = m.winUntil, m.epoch.Load()
	m.mu.Unlock()
	return
}

func (m *machine) takeLocked(want uint64) (uint64, uint64, time.Duration, error) {
	if m.winOpen && m.nextSeq < m.perTick && m.clk.mono() < m.winUntil {
		n := min(want, m.perTick-m.nextSeq)
		first := m.winBase + m.nextSeq
		m.nextSeq += n
		return first, n, 0, nil
	}
	return m.takeReading(want)
}

// takeReading is a step with a wall-clock reading, under the grant in force.
func (m *machine) takeReading(want uint64) (uint64, uint64, time.Duration, error) {
	m.winOpen = false
	g := m.g
	if g == nil {
		return 0, 0, 0, errNoGrant
	}
	unixNs, mono := m.clk.now()
	if mono >= g.deadline {
		// An expired grant leaves the cursor as it was.
		return 0, 0, 0, errLeaseExpired
	}
	m.cursorFor(g)
	stamp, back, err := admit(m.layout, g, m.last, unixNs, m.maxBack)
	if err != nil {
		return 0, 0, 0, err
	}
	if back > 0 {
		return 0, 0, back, nil
	}
	if stamp > m.last {
		m.last = stamp
		m.nextSeq = firstSequence(m.nextSeq, m.perTick)
	} else if m.nextSeq >= m.perTick {
		next := int64(m.layout.EpochUnixMs+m.last+m.layout.unitMs()) * int64(time.Millisecond)
		return 0, 0, time.Duration(max(next-unixNs, 1)), nil
	}
	m.winOpen = true
	m.winUntil = mono + min(windowSpan, (g.deadline-mono)/2)
	m.winBase = m.layout.Encode(m.last, g.machineID, 0)
	n := min(want, m.perTick-m.nextSeq)
	first := m.winBase + m.nextSeq
	m.nextSeq += n
	return first, n, 0, nil
}

// cursorFor moves the cursor to g: ours is kept for the same machine id
// while it is above g's floor; otherwise a fresh one starts at the floor
// (someone, possibly an earlier us, may have stamped up to it).
func (m *machine) cursorFor(g *grant) {
	if m.hasCur && m.curMachine == g.machineID && m.last > g.floor {
		return
	}
	m.hasCur, m.curMachine, m.last, m.nextSeq = true, g.machineID, g.floor, m.perTick
}

// ready reports whether a take would issue now (or after a short backwards
// step is waited out): a grant before its deadline and a clock the rules of
// admit accept.
func (m *machine) ready() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.g
	if g == nil {
		return false
	}
	unixNs, mono := m.clk.now()
	if mono >= g.deadline {
		return false
	}
	last := g.floor
	if m.hasCur && m.curMachine == g.machineID && m.last > g.floor {
		last = m.last
	}
	_, _, err := admit(m.layout, g, last, unixNs, m.maxBack)
	return err == nil
}

var (
	errNoGrant      = &GenerateError{Kind: ErrNoGrant}
	errLeaseExpired = &GenerateError{Kind: ErrLeaseExpired}
)

// admit is the one rule for whether a holder may stamp now (the Rust
// generator's sequence::admit). last is the last timestamp stamped under g's
// machine id, or its floor before any stamp (layout ms); unixNs the wall
// clock. In order: the wall clock is at or after the layout's epoch; the
// first ms of its tick is above the floor; it is at or below the fence and
// the layout's last timestamp; its tick has not stepped back from last by
// more than maxBack (a smaller step returns back > 0, to be waited out). It
// returns the stamp: the tick's first ms. (The deadline is checked before.)
func admit(l Layout, g *grant, last uint64, unixNs int64, maxBack time.Duration) (stamp uint64, back time.Duration, err error) {
	unixMs := unixNs / int64(time.Millisecond)
	if unixNs < 0 || uint64(unixMs) < l.EpochUnixMs {
		return 0, 0, &GenerateError{Kind: ErrClockBeforeEpoch}
	}
	now := uint64(unixMs) - l.EpochUnixMs
	stamp = l.tickStart(now)
	if stamp <= g.floor {
		wait := time.Duration(l.firstStampAfter(g.floor)-now) * time.Millisecond
		return 0, 0, &GenerateError{Kind: ErrClockBehindFloor, Wait: wait}
	}
	if now > g.fence {
		return 0, 0, &GenerateError{Kind: ErrFenceReached, Fence: g.fence}
	}
	if now > l.maxTimestamp() {
		return 0, 0, &GenerateError{Kind: ErrLayoutExhausted, Fence: l.maxTimestamp()}
	}
	if stamp < last {
		// last may lie inside now's tick (a floor kept from an earlier
		// grant): the clock is back once a tick starts at or above it.
		unit := l.unitMs()
		by := time.Duration((last+unit-1)/unit*unit-now) * time.Millisecond
		if by <= maxBack {
			return 0, by, nil
		}
		return 0, 0, &GenerateError{Kind: ErrClockSteppedBack, Wait: by}
	}
	return stamp, 0, nil
}

// firstSequence is the sequence a new tick starts at, given where the last
// tick left off: left where it was while below half the range, else 0. At
// low traffic ids then spread over the low bits instead of all ending in 0;
// a saturated machine id still starts each tick at 0 (the Rust generator's
// first_sequence, CosId's sequenceResetThreshold rule).
func firstSequence(leftOff, perTick uint64) uint64 {
	if leftOff < perTick/2 {
		return leftOff
	}
	return 0
}

// fill appends n strictly ascending ids of m to out, waiting out sequence
// exhaustion and small backwards steps. On an error the ids already taken
// are dropped by the caller (a gap, never a reuse).
func (m *machine) fill(ctx context.Context, n uint64, out []uint64) ([]uint64, error) {
	for left := n; left > 0; {
		first, count, wait, err := m.take(left)
		if err != nil {
			return out, err
		}
		if count == 0 {
			if err := m.clk.sleep(ctx, wait); err != nil {
				return out, err
			}
			continue
		}
		for i := range count {
			out = append(out, first+i)
		}
		left -= count
	}
	return out, nil
}
