package main

// The embedded generator's ops, as the Rust driver (conformance/src/bin/
// driver.rs) answers them. Ids are decimal strings; an error answer carries
// "code" and "message", and "reason": the stop reason once the generator
// stopped (lease_gone, token_refused, machine_ids_changed, expired,
// shut_down, clock_past_fence, namespace_gone, namespace_rolled_back), or
// for embedded_start the fail-fast rule that refused the grant
// (invalid_layout, machine_id_out_of_range, lease_expired, grant_count,
// clock_behind_floor, clock_past_fence; null for a server's refusal).
//
//	{"op":"embedded_start","endpoint":"http://…","namespace":"…","machine_ids":2,"api_key":null,
//	 "check_interval_ms":30000 (0: never),"max_floor_wait_ms":30000,"acquire_attempts":1,
//	 "clock_offset_ms":0}  -> {"ok":true,"machine_ids":[…]}
//	  Go extras: "tls", "request_timeout_ms" (as open), "requester" ({"host_id","pid",
//	  "start_unix_ms","nonce"}: restart under an identity; the answer then
//	  carries the one in use as "requester"), "omit_client_time".
//	{"op":"embedded_take","count":N}  -> {"ok":true,"ids":[…]} (one NextIDs(N): strictly ascending)
//	  Go extra: "spread": "round_robin", "key" (with "key":K), "by_p" or
//	  "pinned" (one Worker per held machine id, in turn) takes N single ids.
//	{"op":"embedded_take_until_stop","pace_ms":1,"max_ms":10000}
//	  -> one NextID every pace_ms until one fails: its error answer with
//	     every id taken in "ids"; DEADLINE_EXCEEDED (with the ids) after max_ms
//	{"op":"embedded_stopped","wait_ms":0} -> {"ok":true,"reason":…|null}
//	{"op":"embedded_shutdown"} -> {"ok":true,"released":N}

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"google.golang.org/grpc/status"

	snowkeep "example.invalid/snowkeep/clients/go"
)

type requesterJSON struct {
	HostID      string `json:"host_id"`
	PID         uint32 `json:"pid"`
	StartUnixMs uint64 `json:"start_unix_ms"`
	Nonce       string `json:"nonce"`
}

var stopNames = map[snowkeep.StopReason]string{
	snowkeep.StopLeaseGone: "lease_gone", snowkeep.StopTokenRefused: "token_refused",
	snowkeep.StopMachineIDsChanged: "machine_ids_changed", snowkeep.StopExpired: "expired",
	snowkeep.StopShutDown: "shut_down", snowkeep.StopClockPastFence: "clock_past_fence",
	snowkeep.StopNamespaceGone: "namespace_gone", snowkeep.StopNamespaceRolledBack: "namespace_rolled_back",
}

var grantKinds = []struct {
	err  error
	name string
}{
	{snowkeep.ErrGrantBadLayout, "invalid_layout"}, {snowkeep.ErrGrantMachineIDOutOfRange, "machine_id_out_of_range"},
	{snowkeep.ErrGrantExpired, "lease_expired"}, {snowkeep.ErrGrantCount, "grant_count"},
	{snowkeep.ErrGrantClockBehindFloor, "clock_behind_floor"}, {snowkeep.ErrGrantClockPastFence, "clock_past_fence"},
}

// codeOf is the canonical code name of err: an *snowkeep.Error's, a
// context's end, or the GRPCStatus of the embedded generator's errors.
func codeOf(err error) string {
	var withStatus interface{ GRPCStatus() *status.Status }
	if errors.As(err, &withStatus) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return snowkeep.CodeName(withStatus.GRPCStatus().Code())
	}
	return fromErr(err, nil)["code"].(string)
}

func stopReason(g *snowkeep.EmbeddedGenerator) any {
	var se *snowkeep.StopError
	if g != nil && errors.As(g.Err(), &se) {
		return stopNames[se.Reason]
	}
	return nil
}

func (d *driver) embedded(ctx context.Context, r *request) map[string]any {
	if r.Op == "embedded_start" {
		return d.embeddedStart(ctx, r)
	}
	if d.gen == nil {
		return errAnswer("FAILED_PRECONDITION", "no embedded generator: send embedded_start first", nil)
	}
	switch r.Op {
	case "embedded_take":
		return d.embeddedTake(ctx, r)
	case "embedded_take_until_stop":
		return d.embeddedTakeUntilStop(ctx, r)
	case "embedded_stopped":
		until := time.Now().Add(ms(r.WaitMs))
		select {
		case <-d.gen.Stopped():
		case <-time.After(time.Until(until)):
		}
		return map[string]any{"ok": true, "reason": stopReason(d.gen)}
	case "embedded_shutdown":
		n, err := d.gen.Shutdown(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "driver: embedded Release failed:", err)
		}
		d.gen, d.workers = nil, nil
		return map[string]any{"ok": true, "released": n}
	}
	return errAnswer("UNIMPLEMENTED", "unknown op "+strconv.Quote(r.Op), nil)
}

func (d *driver) embeddedStart(ctx context.Context, r *request) map[string]any {
	d.shutdownGen()
	cfg := snowkeep.EmbeddedConfig{Endpoint: r.Endpoint, Namespace: r.Namespace, MachineIDs: r.MachineIDs,
		AcquireAttempts: 1, OmitClientTime: r.OmitClientTime, ClockOffset: ms(r.ClockOffsetMs)}
	if r.AcquireAttempts != nil {
		cfg.AcquireAttempts = *r.AcquireAttempts
	}
	if r.CheckIntervalMs != nil {
		cfg.CheckInterval = ms(*r.CheckIntervalMs)
		if *r.CheckIntervalMs == 0 {
			cfg.CheckInterval = -1 // 0 in the protocol: never check (as in Rust)
		}
	}
	if r.MaxFloorWaitMs != nil {
		cfg.MaxFloorWait = max(ms(*r.MaxFloorWaitMs), time.Nanosecond)
	}
	if q := r.Requester; q != nil {
		cfg.Requester = snowkeep.Requester{HostID: q.HostID, PID: q.PID, StartUnixMs: q.StartUnixMs, Nonce: q.Nonce}
	}
	g, err := snowkeep.StartEmbedded(ctx, cfg, clientOptions(r)...)
	if err != nil {
		a := errAnswer(codeOf(err), err.Error(), nil)
		a["reason"] = nil
		for _, k := range grantKinds {
			if errors.Is(err, k.err) {
				a["reason"] = k.name
			}
		}
		return a
	}
	d.gen = g
	q := g.Requester()
	return map[string]any{"ok": true, "machine_ids": g.MachineIDs(),
		"requester": requesterJSON{HostID: q.HostID, PID: q.PID, StartUnixMs: q.StartUnixMs, Nonce: q.Nonce}}
}

// takeFailure is the error answer of a take that failed, with the reason
// the generator stopped: a take can fail a moment before the stop is
// recorded (the deadline ends issuance and the renewer's stop at once), so
// it waits up to 1 s for one; null when it did not stop.
func (d *driver) takeFailure(err error, ids []uint64) map[string]any {
	select {
	case <-d.gen.Stopped():
	case <-time.After(time.Second):
	}
	a := errAnswer(codeOf(err), err.Error(), ids)
	a["reason"] = stopReason(d.gen)
	return a
}

func (d *driver) embeddedTake(ctx context.Context, r *request) map[string]any {
	n, bad := intArg(r.Count, "count")
	if bad != nil {
		return bad
	}
	if r.Spread == "" || r.Spread == "batch" {
		ids, err := d.gen.NextIDs(ctx, n)
		if err != nil {
			return d.takeFailure(err, []uint64{})
		}
		return map[string]any{"ok": true, "ids": idStrings(ids)}
	}
	if r.Spread == "pinned" && d.workers == nil {
		for range d.gen.MachineIDs() {
			d.workers = append(d.workers, d.gen.Pin())
		}
	}
	ids := make([]uint64, 0, max(n, 0))
	for i := range n {
		var id uint64
		var err error
		switch r.Spread {
		case "key":
			id, err = d.gen.NextIDFor(ctx, r.Key)
		case "by_p":
			id, err = d.gen.NextIDByP(ctx)
		case "pinned":
			id, err = d.workers[i%len(d.workers)].NextID(ctx)
		default:
			id, err = d.gen.NextID(ctx)
		}
		if err != nil {
			return d.takeFailure(err, ids)
		}
		ids = append(ids, id)
	}
	return map[string]any{"ok": true, "ids": idStrings(ids)}
}

func (d *driver) embeddedTakeUntilStop(ctx context.Context, r *request) map[string]any {
	pace, maxMs := int64(1), int64(10_000)
	if r.PaceMs != 0 {
		pace = r.PaceMs
	}
	if r.MaxMs != nil {
		maxMs = *r.MaxMs
	}
	until := time.Now().Add(ms(maxMs))
	ids := []uint64{}
	for time.Now().Before(until) {
		id, err := d.gen.NextID(ctx)
		if err != nil {
			return d.takeFailure(err, ids)
		}
		ids = append(ids, id)
		time.Sleep(ms(pace))
	}
	return errAnswer("DEADLINE_EXCEEDED", "the generator did not stop within max_ms", ids)
}

func (d *driver) shutdownGen() {
	if d.gen != nil {
		_, _ = d.gen.Shutdown(context.Background())
		d.gen, d.workers = nil, nil
	}
}
