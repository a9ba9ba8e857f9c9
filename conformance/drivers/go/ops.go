package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"time"

	snowkeep "example.invalid/snowkeep/clients/go"
)

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

func (d *driver) open(r *request) map[string]any {
	d.closeClient() // the embedded generator, if any, stays
	c, err := snowkeep.New(r.Endpoints, clientOptions(r)...)
	if err != nil {
		return fromErr(err, nil)
	}
	d.client = c
	return okAnswer()
}

// clientOptions are the client options of an open (or embedded_start)
// request: api_key, tls, request_timeout_ms, retry_budget_ms, backoff_ms,
// max_backoff_ms (absent or 0: the client's default).
func clientOptions(r *request) []snowkeep.Option {
	var opts []snowkeep.Option
	if r.APIKey != nil {
		opts = append(opts, snowkeep.WithAPIKey(*r.APIKey))
	}
	if r.TLS != nil {
		var t snowkeep.TLSConfig
		if r.TLS.CA != nil {
			t.CAFile = *r.TLS.CA
		}
		if r.TLS.Cert != nil {
			t.CertFile = *r.TLS.Cert
		}
		if r.TLS.Key != nil {
			t.KeyFile = *r.TLS.Key
		}
		opts = append(opts, snowkeep.WithTLS(t))
	}
	if r.RequestTimeoutMs != 0 {
		opts = append(opts, snowkeep.WithRequestTimeout(ms(r.RequestTimeoutMs)))
	}
	if r.RetryBudgetMs != 0 {
		opts = append(opts, snowkeep.WithRetryBudget(ms(r.RetryBudgetMs)))
	}
	if r.BackoffMs != 0 || r.MaxBackoffMs != 0 {
		b, m := snowkeep.DefaultBackoff, snowkeep.DefaultMaxBackoff
		if r.BackoffMs != 0 {
			b = ms(r.BackoffMs)
		}
		if r.MaxBackoffMs != 0 {
			m = ms(r.MaxBackoffMs)
		}
		opts = append(opts, snowkeep.WithBackoff(b, m))
	}
	return opts
}

// intArg reads a JSON number as an int for the client to validate; a
// number that is not an integer, or out of int range, is refused here,
// naming the parameter.
func intArg(n json.Number, name string) (int, map[string]any) {
	v, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil {
		return 0, errAnswer("INVALID_ARGUMENT", name+" must be an integer, got "+strconv.Quote(n.String()), nil)
	}
	if v > 1<<31 || v < -1<<31 {
		v = 1 << 31 // out of every range the client accepts: it refuses it
	}
	return int(v), nil
}

func (d *driver) nextIDs(ctx context.Context, r *request) map[string]any {
	n, bad := intArg(r.Count, "count")
	if bad != nil {
		return bad
	}
	ids, err := d.client.NextIDs(ctx, n)
	if err != nil {
		return fromErr(err, nil)
	}
	return map[string]any{"ok": true, "ids": idStrings(ids)}
}

func totalArg(n json.Number) (uint64, map[string]any) {
	s := n.String()
	if strings.HasPrefix(s, "-") {
		return 0, errAnswer("INVALID_ARGUMENT", "total must be 1 to 9223372036854775807, got "+s, nil)
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, errAnswer("INVALID_ARGUMENT", "total must be an integer 1 to 9223372036854775807, got "+strconv.Quote(s), nil)
	}
	return v, nil
}

func (d *driver) stream(ctx context.Context, r *request) map[string]any {
	total, bad := totalArg(r.Total)
	if bad != nil {
		return bad
	}
	s, err := d.client.Stream(ctx, total, r.BatchSize)
	if err != nil {
		return fromErr(err, []uint64{})
	}
	defer s.Close()
	all := []uint64{}
	batches := 0
	for ids, err := range s.All() {
		if err != nil {
			return fromErr(err, all)
		}
		all = append(all, ids...)
		batches++
		if r.ProgressEvery > 0 && batches%r.ProgressEvery == 0 {
			d.emit(map[string]any{"progress": map[string]any{
				"received": s.Received(), "last_id": strconv.FormatUint(ids[len(ids)-1], 10)}})
		}
		if r.PaceMs > 0 {
			time.Sleep(ms(r.PaceMs))
		}
	}
	return map[string]any{"ok": true, "ids": idStrings(all)}
}

func (d *driver) poolOpen(r *request) map[string]any {
	if d.pool != nil {
		d.pool.Close()
		d.pool = nil
	}
	var opts []snowkeep.PoolOption
	if r.Batch != nil {
		opts = append(opts, snowkeep.WithPoolBatch(*r.Batch))
	}
	if r.LowWater != nil {
		opts = append(opts, snowkeep.WithPoolLowWater(*r.LowWater))
	}
	if r.MaxAgeMs != nil {
		opts = append(opts, snowkeep.WithPoolMaxAge(ms(*r.MaxAgeMs)))
	}
	p, err := d.client.NewPool(opts...)
	if err != nil {
		return fromErr(err, nil)
	}
	d.pool, d.poolLive = p, true
	return okAnswer()
}

func (d *driver) poolTake(ctx context.Context, r *request) map[string]any {
	n, bad := intArg(r.Count, "count")
	if bad != nil {
		return bad
	}
	if d.pool == nil {
		return errAnswer("FAILED_PRECONDITION", "pool closed (no open pool)", []uint64{})
	}
	ids := make([]uint64, 0, max(n, 0))
	for range n {
		id, err := d.pool.Next(ctx)
		if err != nil {
			return fromErr(err, ids)
		}
		ids = append(ids, id)
	}
	return map[string]any{"ok": true, "ids": idStrings(ids)}
}

func (d *driver) decode(ctx context.Context, r *request) map[string]any {
	var text string
	if err := json.Unmarshal(r.ID, &text); err != nil {
		text = strings.TrimSpace(string(r.ID))
	}
	id, err := strconv.ParseUint(text, 10, 64)
	if err != nil {
		return errAnswer("INVALID_ARGUMENT", "id must be a decimal unsigned 64-bit integer, got "+strconv.Quote(text), nil)
	}
	p, err := d.client.Decode(ctx, id)
	if err != nil {
		return fromErr(err, nil)
	}
	return map[string]any{"ok": true, "unix_ms": p.UnixMs, "machine_id": p.MachineID, "sequence": p.Sequence}
}
