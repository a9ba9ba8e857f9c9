package main

import (
	"context"
	"slices"
	"sync"
	"time"

	snowkeep "example.invalid/snowkeep/clients/go"
)

// benchStream reads a stream of total ids, counting them.
func (d *driver) benchStream(ctx context.Context, r *request) map[string]any {
	total, bad := totalArg(r.Total)
	if bad != nil {
		return bad
	}
	start := time.Now()
	s, err := d.client.Stream(ctx, total, r.BatchSize)
	if err != nil {
		return fromErr(err, nil)
	}
	n := 0
	for ids, err := range s.All() {
		if err != nil {
			return fromErr(err, nil)
		}
		n += len(ids)
	}
	return map[string]any{"ok": true, "ids": n, "seconds": time.Since(start).Seconds()}
}

// benchUnary runs NextIDs(1) from concurrency callers for the given seconds.
func (d *driver) benchUnary(ctx context.Context, r *request) map[string]any {
	workers := max(r.Concurrency, 1)
	ctx, cancel := context.WithTimeout(ctx, time.Duration(r.Seconds*float64(time.Second)))
	defer cancel()
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			var mine []time.Duration
			for ctx.Err() == nil {
				t := time.Now()
				_, err := d.client.NextIDs(ctx, 1)
				if err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						firstErr = cmpErr(firstErr, err)
						mu.Unlock()
					}
					continue
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(lat) == 0 && firstErr != nil {
		return fromErr(firstErr, nil)
	}
	slices.Sort(lat)
	return map[string]any{"ok": true, "calls": len(lat),
		"p50_ms": quantileMs(lat, 0.50), "p99_ms": quantileMs(lat, 0.99)}
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

func quantileMs(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(int(q*float64(len(sorted))), len(sorted)-1)
	return float64(sorted[i]) / float64(time.Millisecond)
}

// benchPool takes count ids from the open pool, or from a pool of batches of
// 10,000 (low water 5,000) made for the run when none is open.
func (d *driver) benchPool(ctx context.Context, r *request) map[string]any {
	n, bad := intArg(r.Count, "count")
	if bad != nil {
		return bad
	}
	// The protocol's fresh pool (conformance/README.md): batch 100000, low
	// water 50000, the first Next (the first fill) untimed, so the timed
	// calls are local pops.
	p, err := d.client.NewPool(snowkeep.WithPoolBatch(100000), snowkeep.WithPoolLowWater(50000))
	if err != nil {
		return fromErr(err, nil)
	}
	defer p.Close()
	if _, err := p.Next(ctx); err != nil {
		return fromErr(err, nil)
	}
	start := time.Now()
	for i := range n {
		if _, err := p.Next(ctx); err != nil {
			a := fromErr(err, nil)
			a["taken"] = i
			return a
		}
	}
	took := time.Since(start)
	return map[string]any{"ok": true, "ids": n, "ns_per_id": float64(took.Nanoseconds()) / float64(max(n, 1))}
}
