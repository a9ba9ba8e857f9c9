// Command driver is the conformance driver of the Go snowkeep client: it
// reads one JSON request per line on stdin and answers with JSON lines on
// stdout, as conformance/README.md describes, using the client's public API
// only.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"

	snowkeep "example.invalid/snowkeep/clients/go"
)

// request holds the fields of every op; absent ones stay nil or zero.
type request struct {
	Op               string          `json:"op"`
	Endpoints        []string        `json:"endpoints"`
	APIKey           *string         `json:"api_key"`
	TLS              *tlsRequest     `json:"tls"`
	RequestTimeoutMs int64           `json:"request_timeout_ms"`
	RetryBudgetMs    int64           `json:"retry_budget_ms"`
	BackoffMs        int64           `json:"backoff_ms"`
	MaxBackoffMs     int64           `json:"max_backoff_ms"`
	Count            json.Number     `json:"count"`
	Total            json.Number     `json:"total"`
	BatchSize        int             `json:"batch_size"`
	PaceMs           int64           `json:"pace_ms"`
	ProgressEvery    int             `json:"progress_every"`
	Batch            *int            `json:"batch"`
	LowWater         *int            `json:"low_water"`
	MaxAgeMs         *int64          `json:"max_age_ms"`
	ID               json.RawMessage `json:"id"`
	Concurrency      int             `json:"concurrency"`
	Seconds          float64         `json:"seconds"`

	// The embedded generator's ops (embedded.go).
	Endpoint        string         `json:"endpoint"`
	Namespace       string         `json:"namespace"`
	MachineIDs      int            `json:"machine_ids"`
	CheckIntervalMs *int64         `json:"check_interval_ms"`
	MaxFloorWaitMs  *int64         `json:"max_floor_wait_ms"`
	AcquireAttempts *int           `json:"acquire_attempts"`
	ClockOffsetMs   int64          `json:"clock_offset_ms"`
	OmitClientTime  bool           `json:"omit_client_time"`
	Requester       *requesterJSON `json:"requester"`
	Spread          string         `json:"spread"`
	Key             uint64         `json:"key"`
	WaitMs          int64          `json:"wait_ms"`
	MaxMs           *int64         `json:"max_ms"`
}

type tlsRequest struct {
	CA   *string `json:"ca"`
	Cert *string `json:"cert"`
	Key  *string `json:"key"`
}

// driver holds the open client and pool, and the embedded generator.
type driver struct {
	gen     *snowkeep.EmbeddedGenerator
	workers []*snowkeep.Worker
	out     *bufio.Writer
	client  *snowkeep.Client
	pool    *snowkeep.Pool
	// poolLive is false once pool_close closed pool (pool_take then answers
	// "pool closed" from the client; bench_pool makes its own pool).
	poolLive bool
}

func main() {
	d := &driver{out: bufio.NewWriterSize(os.Stdout, 1<<20)}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	for in.Scan() {
		line := in.Bytes()
		if len(line) == 0 {
			continue
		}
		var r request
		dec := json.NewDecoder(bytesReader(line))
		dec.UseNumber()
		if err := dec.Decode(&r); err != nil {
			d.answer(errAnswer("INVALID_ARGUMENT", "request is not JSON: "+err.Error(), nil))
			continue
		}
		d.answer(d.handle(context.Background(), &r))
	}
	d.closeAll()
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "driver: reading stdin:", err)
		os.Exit(1)
	}
}

func (d *driver) handle(ctx context.Context, r *request) map[string]any {
	switch r.Op {
	case "open":
		return d.open(r)
	case "close":
		d.closeAll()
		return okAnswer()
	case "embedded_start", "embedded_take", "embedded_take_until_stop", "embedded_stopped", "embedded_shutdown":
		return d.embedded(ctx, r)
	case "pool_close":
		if d.pool != nil {
			d.pool.Close()
		}
		d.poolLive = false
		return okAnswer()
	}
	if d.client == nil {
		return errAnswer("FAILED_PRECONDITION", "client closed (no open client)", nil)
	}
	switch r.Op {
	case "next_ids":
		return d.nextIDs(ctx, r)
	case "stream":
		return d.stream(ctx, r)
	case "pool_open":
		return d.poolOpen(r)
	case "pool_take":
		return d.poolTake(ctx, r)
	case "decode":
		return d.decode(ctx, r)
	case "bench_stream":
		return d.benchStream(ctx, r)
	case "bench_unary":
		return d.benchUnary(ctx, r)
	case "bench_pool":
		return d.benchPool(ctx, r)
	}
	return errAnswer("UNIMPLEMENTED", "unknown op "+strconv.Quote(r.Op), nil)
}

// closeAll shuts the embedded generator down and closes the client and pool.
func (d *driver) closeAll() {
	d.shutdownGen()
	d.closeClient()
}

func (d *driver) closeClient() {
	if d.pool != nil {
		d.pool.Close()
		d.pool, d.poolLive = nil, false
	}
	if d.client != nil {
		_ = d.client.Close()
		d.client = nil
	}
}

// emit writes one JSON line and flushes it.
func (d *driver) emit(v any) {
	enc := json.NewEncoder(d.out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		_, _ = d.out.WriteString(`{"ok":false,"code":"INTERNAL","message":"cannot encode the answer"}` + "\n")
	}
	_ = d.out.Flush()
}

func (d *driver) answer(a map[string]any) { d.emit(a) }

func okAnswer() map[string]any { return map[string]any{"ok": true} }

func errAnswer(code, msg string, ids []uint64) map[string]any {
	a := map[string]any{"ok": false, "code": code, "message": msg}
	if ids != nil {
		a["ids"] = idStrings(ids)
	}
	return a
}

// fromErr is the error answer for err: the *snowkeep.Error's code, or
// CANCELLED / DEADLINE_EXCEEDED for a context's end.
func fromErr(err error, ids []uint64) map[string]any {
	var e *snowkeep.Error
	switch {
	case errors.As(err, &e):
		return errAnswer(snowkeep.CodeName(e.Code()), e.Message(), ids)
	case errors.Is(err, context.Canceled):
		return errAnswer("CANCELLED", err.Error(), ids)
	case errors.Is(err, context.DeadlineExceeded):
		return errAnswer("DEADLINE_EXCEEDED", err.Error(), ids)
	}
	return errAnswer("UNKNOWN", err.Error(), ids)
}

func idStrings(ids []uint64) []string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(id, 10)
	}
	return s
}
