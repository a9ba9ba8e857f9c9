package snowkeep

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	pb "example.invalid/snowkeep/clients/go/gen/snowkeepv1"
)

// A grant that lists one machine id twice would give two slots the same
// machine id, each with its own cursor: both stamp sequence 0 of the same
// tick, two equal ids. StartEmbedded must refuse it (and release it).
func TestAGrantListingAMachineIDTwiceIsRefusedAndReleased(t *testing.T) {
	clk := newTestClock()
	f := newFakeLease(t, clk)
	f.grant = grantOf(layoutMs-10, layoutMs+600_000, 600_000, 5, 5)
	cfg := testConfig(f, clk)
	cfg.MachineIDs = 2
	cfg.CheckInterval = -1
	g, err := StartEmbedded(context.Background(), cfg)
	if err == nil {
		defer g.Shutdown(context.Background())
		a, _ := g.NextIDFor(context.Background(), 0)
		b, _ := g.NextIDFor(context.Background(), 1)
		t.Fatalf("started on machine ids %v: slot 0 issued %d, slot 1 issued %d", g.MachineIDs(), a, b)
	}
	var ge *GrantError
	if !errors.Is(err, ErrGrantCount) || !errors.As(err, &ge) || !strings.Contains(ge.Detail, "machine id 5") {
		t.Fatal(err)
	}
	if rel := <-f.released; rel.GetLeaseToken() != testToken || len(rel.GetLastUsedMs()) != 0 {
		t.Fatal(rel)
	}
}

// A grant whose lease already ended by the local clock when its answer
// arrived (counted from when the Acquire was sent) is an expired grant: the
// contract fails fast on it and releases it, rather than handing over a
// generator that issues nothing and then stops without releasing.
func TestAGrantExpiredByTheLocalClockOnArrivalIsRefusedAndReleased(t *testing.T) {
	clk := newTestClock()
	f := newFakeLease(t, clk)
	f.grant = grantOf(layoutMs-10, layoutMs+600_000, 1000, 5)
	f.acquireFn = func(int, *pb.AcquireRequest) (*pb.LeaseGrant, error) {
		clk.advance(2 * time.Second) // the answer took longer than the lease
		return f.grant, nil
	}
	cfg := testConfig(f, clk)
	cfg.CheckInterval = -1
	g, err := StartEmbedded(context.Background(), cfg)
	if err == nil {
		defer g.Shutdown(context.Background())
		t.Fatalf("started on an expired grant (Ready %v)", g.Ready())
	}
	var ge *GrantError
	if !errors.Is(err, ErrGrantExpired) || !errors.As(err, &ge) {
		t.Fatal(err)
	}
	if rel := <-f.released; rel.GetLeaseToken() != testToken || len(rel.GetLastUsedMs()) != 0 {
		t.Fatal(rel)
	}
	if n := f.counts(); n != [4]int{1, 0, 0, 1} {
		t.Fatal(n)
	}
}

// A nil context is misuse, but it must not panic only under load: before,
// every call worked until one had to wait for the next tick (a used-up
// sequence), and then panicked in the wait. A nil ctx waits like
// context.Background(); Shutdown(nil) still releases.
func TestANilContextNeverPanicsInAWaitAndShutdownStillReleases(t *testing.T) {
	clk := newTestClock()
	e := bareGen(layoutFromPB(defaultLayout()), clk, testGrant(clk, 5))
	clk.auto = true // a wait advances the clock
	var nilCtx context.Context
	w := e.Pin()
	takes := map[string]func() error{
		"NextID":         func() error { _, err := e.NextID(nilCtx); return err },
		"NextIDFor":      func() error { _, err := e.NextIDFor(nilCtx, 0); return err },
		"NextIDByP":      func() error { _, err := e.NextIDByP(nilCtx); return err },
		"NextIDs":        func() error { _, err := e.NextIDs(nilCtx, 3000); return err },
		"Worker.NextIDs": func() error { _, err := w.NextIDs(nilCtx, 3000); return err },
	}
	for name, take := range takes {
		times := 1100 // past a used-up tick: waited out
		if strings.HasSuffix(name, "NextIDs") {
			times = 2
		}
		for range times {
			err := func() (err error) {
				defer func() {
					if p := recover(); p != nil {
						err = errors.New("panicked: " + strings.TrimSpace(strings.SplitN(fmtAny(p), "\n", 2)[0]))
					}
				}()
				return take()
			}()
			if err != nil {
				t.Fatalf("%s(nil): %v", name, err)
			}
		}
	}

	f := newFakeLease(t, clk)
	cfg := testConfig(f, clk)
	cfg.CheckInterval = -1
	clk.auto = false
	g := start(t, f, cfg)
	released, err := func() (n uint32, err error) {
		defer func() {
			if p := recover(); p != nil {
				err = errors.New("panicked: " + fmtAny(p))
			}
		}()
		return g.Shutdown(nilCtx)
	}()
	if released != 1 || err != nil || f.counts()[3] != 1 || !errors.Is(g.Err(), ErrStopShutDown) {
		t.Fatal(released, err, f.counts(), g.Err())
	}
}

func fmtAny(p any) string {
	if e, ok := p.(error); ok {
		return e.Error()
	}
	if s, ok := p.(string); ok {
		return s
	}
	return "a non-error panic"
}
