package snowkeep

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc/codes"

	pb "example.invalid/snowkeep/clients/go/gen/snowkeepv1"
)

// goneReason is the stop reason of a "lease gone" answer (Renew's
// gone_reason, Check's reason); false for a valid lease, an unset or an
// unknown reason.
func goneReason(r pb.LeaseCheckReason) (StopReason, bool) {
	switch r {
	case pb.LeaseCheckReason_LEASE_CHECK_REASON_LEASE_GONE:
		return StopLeaseGone, true
	case pb.LeaseCheckReason_LEASE_CHECK_REASON_NAMESPACE_GONE:
		return StopNamespaceGone, true
	case pb.LeaseCheckReason_LEASE_CHECK_REASON_ROLLED_BACK:
		return StopNamespaceRolledBack, true
	}
	return 0, false
}

// renewLoop renews until issuance stops: at once, then at half the
// remaining lease; after a failed renewal every min(10 min, remaining/4),
// at least 5 s apart. Past the local deadline it stops issuance for good
// (StopExpired), also while a Renew is in flight: the call is given up at
// the deadline.
func (e *EmbeddedGenerator) renewLoop(ctx context.Context, deadline time.Duration) {
	next := e.clk.mono()
	for {
		if e.clk.sleep(ctx, min(next, deadline)-e.clk.mono()) != nil || e.stopErr.Load() != nil {
			return
		}
		if e.clk.mono() >= deadline {
			e.stop(&StopError{Reason: StopExpired})
			return
		}
		sent := e.clk.mono()
		req := &pb.RenewRequest{Requester: e.requester.toPB(), Namespace: e.cfg.Namespace,
			ClientTimeUnixMs: e.clientTime(), LeaseToken: e.token, NamespaceIncarnation: e.incarnation}
		// A Renew that hangs (a stopped server answers nothing until the
		// call's timeout) must not hold the stop past the deadline: the call
		// gives up at it, and the next turn stops with StopExpired.
		cctx, cancel := context.WithTimeout(ctx, min(e.timeout, deadline-sent))
		g, err := e.api.Renew(cctx, req)
		cancel()
		if ctx.Err() != nil {
			return // Shutdown
		}
		if err != nil {
			if fromRPC(err).Code() == codes.PermissionDenied {
				e.stop(&StopError{Reason: StopTokenRefused})
				return
			}
			remaining := max(deadline-e.clk.mono(), 0)
			retry := min(max(remaining/4, minRetry), maxRetry)
			e.log.Warn("snowkeep: Renew failed; retrying", "namespace", e.cfg.Namespace,
				"error", fromRPC(err), "retry_in", retry, "remaining", remaining)
			next = e.clk.mono() + retry
			continue
		}
		if !e.renewed(ctx, g, sent) {
			return
		}
		deadline = sent + time.Duration(g.GetExpiresInMs())*time.Millisecond
		next = sent + (deadline-sent)/2
	}
}

// renewed acts on a renewal's answer: false when it stopped issuance.
func (e *EmbeddedGenerator) renewed(ctx context.Context, g *pb.LeaseGrant, sent time.Duration) bool {
	if len(g.GetMachineIds()) == 0 {
		reason, ok := goneReason(g.GetGoneReason())
		if !ok {
			reason = StopLeaseGone
		}
		e.stop(&StopError{Reason: reason})
		return false
	}
	ids := make([]uint32, 0, len(g.GetMachineIds()))
	for _, m := range g.GetMachineIds() {
		ids = append(ids, m.GetMachineId())
	}
	if !slices.Equal(ids, e.machineIDs) {
		e.stop(&StopError{Reason: StopMachineIDsChanged, Held: len(e.machineIDs), Renewed: len(ids)})
		return false
	}
	if g.GetExpiresInMs() == 0 {
		e.stop(&StopError{Reason: StopExpired})
		return false
	}
	unixNs, _ := e.clk.now()
	if past := pastFence(e.layout, unixNs, g); past > 0 {
		// Stamping nothing while holding the machine ids helps no one.
		released, err := e.releaseAll(context.WithoutCancel(ctx), &StopError{Reason: StopClockPastFence, Past: past})
		e.log.Warn("snowkeep: released the machine ids: the local clock is past the renewed fence",
			"namespace", e.cfg.Namespace, "released", released, "release_error", err)
		return false
	}
	e.publish(g, sent)
	return true
}

// checkLoop asks every CheckInterval whether the lease still stands and
// stops issuance at once when it does not. No answer changes nothing: the
// renewer and the fence rule as before.
func (e *EmbeddedGenerator) checkLoop(ctx context.Context) {
	if e.cfg.CheckInterval < 0 {
		return
	}
	for {
		if e.clk.sleep(ctx, e.cfg.CheckInterval) != nil || e.stopErr.Load() != nil {
			return
		}
		req := &pb.CheckRequest{Requester: e.requester.toPB(), Namespace: e.cfg.Namespace,
			NamespaceIncarnation: e.incarnation, MachineIds: e.machineIDs, LeaseToken: e.token}
		cctx, cancel := context.WithTimeout(ctx, e.timeout)
		answer, err := e.api.Check(cctx, req)
		cancel()
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil && fromRPC(err).Code() == codes.PermissionDenied:
			e.stop(&StopError{Reason: StopTokenRefused})
			return
		case err != nil:
			e.log.Debug("snowkeep: Check failed; issuing on below the fence", "namespace", e.cfg.Namespace,
				"error", fromRPC(err))
		case answer.GetValid():
		default:
			if reason, ok := goneReason(answer.GetReason()); ok {
				e.log.Warn("snowkeep: Check: the lease is gone", "namespace", e.cfg.Namespace,
					"detail", answer.GetDetail())
				e.stop(&StopError{Reason: reason})
				return
			}
			e.log.Warn("snowkeep: Check answered an unknown reason; ignored", "namespace", e.cfg.Namespace,
				"reason", answer.GetReason())
		}
	}
}

// stop withdraws every grant and records why, once; Stopped is closed then.
func (e *EmbeddedGenerator) stop(s *StopError) {
	e.stopMu.Lock()
	defer e.stopMu.Unlock()
	for _, m := range e.machines {
		m.withdraw()
	}
	if e.stopErr.Load() != nil {
		return
	}
	e.stopErr.Store(s)
	close(e.stopped)
	if s.Reason != StopShutDown {
		e.log.Error("snowkeep: embedded generator stopped issuing", "namespace", e.cfg.Namespace,
			"reason", s.Error())
	}
}

// releaseAll stops issuance, drains every machine id and Releases them
// with the last timestamp stamped on each.
func (e *EmbeddedGenerator) releaseAll(ctx context.Context, s *StopError) (uint32, error) {
	e.stop(s)
	return e.release(ctx, e.drain())
}

// drain returns the last timestamp stamped on each machine id used (its
// floor when nothing was stamped under the grant in use), by machine id.
func (e *EmbeddedGenerator) drain() map[uint32]uint64 {
	last := make(map[uint32]uint64, len(e.machines))
	for _, m := range e.machines {
		if id, ts, ok := m.drain(); ok {
			last[id] = ts
		}
	}
	return last
}

// release Releases every machine id of this requester with its token
// (lastUsed by machine id; nil for a grant never used) and returns how
// many the server released.
func (e *EmbeddedGenerator) release(ctx context.Context, lastUsed map[uint32]uint64) (uint32, error) {
	cctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	r, err := e.api.Release(cctx, &pb.ReleaseRequest{Requester: e.requester.toPB(),
		Namespace: e.cfg.Namespace, LastUsedMs: lastUsed, LeaseToken: e.token})
	if err != nil {
		e.log.Warn("snowkeep: Release failed; the machine ids free themselves when the lease expires",
			"namespace", e.cfg.Namespace, "error", fromRPC(err))
		return 0, fromRPC(err)
	}
	return r.GetReleased(), nil
}

// Shutdown blocks issuance, drains every machine id, then Releases them with
// the last timestamp stamped on each (skipped when the lease is already
// gone: then it returns 0, nil) and closes the connection. It returns how
// many machine ids the server released. A failed Release (ctx bounds it,
// and the request timeout) is returned as an *Error but is not fatal: the
// machine ids free themselves when the lease expires. Later calls return
// the first call's result; calls for ids get the StopShutDown *StopError.
func (e *EmbeddedGenerator) Shutdown(ctx context.Context) (uint32, error) {
	ctx = orBackground(ctx)
	e.shutOnce.Do(func() {
		e.cancel()
		e.loops.Wait()
		if e.stopErr.Load() != nil {
			// The lease is gone, or the renewer released it already.
			e.stop(&StopError{Reason: StopShutDown})
			e.drain()
		} else {
			e.shutResult, e.shutErr = e.releaseAll(ctx, &StopError{Reason: StopShutDown})
		}
		_ = e.conn.Close()
	})
	return e.shutResult, e.shutErr
}

// Stopped is closed once the generator stopped issuing for good (a stop
// rule, or Shutdown); Err then says why.
func (e *EmbeddedGenerator) Stopped() <-chan struct{} { return e.stopped }

// Err is nil while the generator may issue, then the *StopError saying why
// it stopped for good (errors.Is with ErrStopped, ErrStopLeaseGone, ...).
func (e *EmbeddedGenerator) Err() error {
	if s := e.stopErr.Load(); s != nil {
		return s
	}
	return nil
}

// Ready reports whether an id can be issued now: not stopped, and at least
// one machine id has a grant in force and a clock its rules accept.
func (e *EmbeddedGenerator) Ready() bool {
	if e.stopErr.Load() != nil {
		return false
	}
	return slices.ContainsFunc(e.machines, (*machine).ready)
}

// MachineIDs are the machine ids held, in the order the grant listed them
// (the slots NextIDFor's key chooses from).
func (e *EmbeddedGenerator) MachineIDs() []uint32 { return slices.Clone(e.machineIDs) }

// Layout is the namespace's layout, as the grant reported it.
func (e *EmbeddedGenerator) Layout() Layout { return e.layout }

// Requester is the identity the machine ids are held under: the configured
// one, or the same with a fresh nonce when StartEmbedded had to start over.
func (e *EmbeddedGenerator) Requester() Requester { return e.requester }
