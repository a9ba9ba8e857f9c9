package snowkeep

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Why a call to the embedded generator got no id. Each *GenerateError wraps
// one of these, so errors.Is(err, ErrFenceReached) tells the cause; errors.As
// gives the details (a wait, a fence). All but ErrLayoutExhausted may heal
// (the next renewal, the clock catching up); after the generator stopped for
// good, calls return its *StopError instead (see ErrStopped).
var (
	// ErrNoGrant: no machine-id lease is held (not yet, or any more).
	ErrNoGrant = errors.New("no valid machine-id lease is held")
	// ErrLeaseExpired: the lease passed its local deadline (by the
	// monotonic clock, counted from when the request that granted it was
	// sent) before a renewal succeeded.
	ErrLeaseExpired = errors.New("the machine-id lease passed its local deadline")
	// ErrClockBehindFloor: the clock's tick is not above the machine id's
	// floor (its previous holders' fences); GenerateError.Wait says how long.
	ErrClockBehindFloor = errors.New("the clock is behind the machine id's floor")
	// ErrFenceReached: the clock is past the persisted fence
	// (GenerateError.Fence, layout ms); the next renewal raises it.
	ErrFenceReached = errors.New("the clock reached the persisted fence")
	// ErrClockSteppedBack: the wall clock stepped back further than
	// EmbeddedConfig.MaxBackwardWait (GenerateError.Wait is the step).
	ErrClockSteppedBack = errors.New("the clock stepped back further than is waited out")
	// ErrClockBeforeEpoch: the wall clock reads before the layout's epoch.
	ErrClockBeforeEpoch = errors.New("the clock is before the layout epoch")
	// ErrLayoutExhausted: the clock is past the layout's last timestamp; no
	// id of this layout can be stamped again.
	ErrLayoutExhausted = errors.New("the clock is past the layout's last timestamp")
)

// GenerateError is why the embedded generator issued no id now: Kind is one
// of ErrNoGrant, ErrLeaseExpired, ErrClockBehindFloor, ErrFenceReached,
// ErrClockSteppedBack, ErrClockBeforeEpoch, ErrLayoutExhausted (errors.Is
// matches it). Its gRPC code (for status.Code) is UNAVAILABLE, except
// ErrLayoutExhausted: FAILED_PRECONDITION.
type GenerateError struct {
	Kind error
	// Wait is how far behind the floor the clock is (ErrClockBehindFloor),
	// or the backwards step (ErrClockSteppedBack).
	Wait time.Duration
	// Fence is the fence reached (ErrFenceReached) or the layout's last
	// timestamp (ErrLayoutExhausted), in layout ms.
	Fence uint64
}

// Error says why, with the wait or the fence where there is one.
func (e *GenerateError) Error() string {
	switch e.Kind {
	case ErrClockBehindFloor, ErrClockSteppedBack:
		return fmt.Sprintf("snowkeep: %v by %v", e.Kind, e.Wait)
	case ErrFenceReached, ErrLayoutExhausted:
		return fmt.Sprintf("snowkeep: %v (%d layout ms)", e.Kind, e.Fence)
	}
	return "snowkeep: " + e.Kind.Error()
}

// Unwrap gives Kind, for errors.Is.
func (e *GenerateError) Unwrap() error { return e.Kind }

// GRPCStatus: UNAVAILABLE (FAILED_PRECONDITION for ErrLayoutExhausted).
func (e *GenerateError) GRPCStatus() *status.Status {
	if e.Kind == ErrLayoutExhausted {
		return status.New(codes.FailedPrecondition, e.Error())
	}
	return status.New(codes.Unavailable, e.Error())
}

// StopReason is why an embedded generator stopped issuing for good (the stop
// rules of docs/api.md, "EmbeddedGenerator follows the Lease API contract").
type StopReason int

// The stop reasons.
const (
	// StopLeaseGone: a renewal answered no machine ids, or a Check said the
	// lease is gone: the server holds nothing for this requester any more.
	StopLeaseGone StopReason = iota + 1
	// StopTokenRefused: Renew or Check refused the lease token
	// (PERMISSION_DENIED): the machine ids are held under another token.
	StopTokenRefused
	// StopMachineIDsChanged: a renewal answered other machine ids (or
	// another count) than the ones held.
	StopMachineIDsChanged
	// StopExpired: the local deadline passed without a successful renewal
	// (or a renewal answered expires_in_ms 0).
	StopExpired
	// StopShutDown: Shutdown was called.
	StopShutDown
	// StopClockPastFence: after a renewal the local clock was still past a
	// renewed fence (ahead of the server's by more than the lease covers);
	// the machine ids were released.
	StopClockPastFence
	// StopNamespaceGone: the namespace no longer exists as granted (deleted,
	// or created again: etcd lost its state).
	StopNamespaceGone
	// StopNamespaceRolledBack: etcd was restored from an older snapshot.
	StopNamespaceRolledBack
)

var stopNames = map[StopReason]string{
	StopLeaseGone: "the server holds no lease for this requester any more",
	StopTokenRefused: "the server refused this generator's lease token: " +
		"its machine ids are no longer its own",
	StopMachineIDsChanged: "a renewal answered other machine ids than the ones held",
	StopExpired:           "the lease expired by the local clock before a renewal succeeded",
	StopShutDown:          "the generator was shut down",
	StopClockPastFence: "the local clock is past the renewed fence (ahead of the server's by " +
		"more than the lease covers); the machine ids were released: sync this host with NTP",
	StopNamespaceGone:       "the namespace no longer exists as granted (etcd lost its state)",
	StopNamespaceRolledBack: "etcd was restored from an older snapshot; the namespace is rolled back",
}

// String is a sentence saying why issuance stopped.
func (r StopReason) String() string {
	if s, ok := stopNames[r]; ok {
		return s
	}
	return fmt.Sprintf("StopReason(%d)", int(r))
}

// StopError is why an embedded generator stopped for good: what Err returns
// once Stopped is closed, and what every later NextID returns. errors.Is(err,
// ErrStopped) matches any; errors.Is(err, ErrStopLeaseGone) (and the other
// ErrStop* values) matches one Reason. Its gRPC code is UNAVAILABLE.
type StopError struct {
	Reason StopReason
	// Held and Renewed count the machine ids held and those a renewal
	// answered (StopMachineIDsChanged).
	Held, Renewed int
	// Past is how far the clock was past the renewed fence (StopClockPastFence).
	Past time.Duration
}

// Error says why the generator stopped, with the details of its Reason.
func (e *StopError) Error() string {
	switch e.Reason {
	case StopMachineIDsChanged:
		return fmt.Sprintf("snowkeep: embedded generator stopped: the server renewed %d machine ids, %d are held",
			e.Renewed, e.Held)
	case StopClockPastFence:
		return fmt.Sprintf("snowkeep: embedded generator stopped: the local clock is %v past the renewed fence; %s",
			e.Past, "the machine ids were released: sync this host with NTP")
	}
	return "snowkeep: embedded generator stopped: " + e.Reason.String()
}

// Is matches ErrStopped, and any *StopError of the same Reason.
func (e *StopError) Is(target error) bool {
	if target == ErrStopped {
		return true
	}
	t, ok := target.(*StopError)
	return ok && t.Reason == e.Reason
}

// GRPCStatus: UNAVAILABLE (this generator issues no more; another can).
func (e *StopError) GRPCStatus() *status.Status { return status.New(codes.Unavailable, e.Error()) }

// ErrStopped matches (errors.Is) every *StopError.
var ErrStopped = errors.New("snowkeep: embedded generator stopped")

// Sentinels per StopReason for errors.Is; each matches every *StopError of
// its Reason, whatever its details.
var (
	ErrStopLeaseGone           = &StopError{Reason: StopLeaseGone}
	ErrStopTokenRefused        = &StopError{Reason: StopTokenRefused}
	ErrStopMachineIDsChanged   = &StopError{Reason: StopMachineIDsChanged}
	ErrStopExpired             = &StopError{Reason: StopExpired}
	ErrStopShutDown            = &StopError{Reason: StopShutDown}
	ErrStopClockPastFence      = &StopError{Reason: StopClockPastFence}
	ErrStopNamespaceGone       = &StopError{Reason: StopNamespaceGone}
	ErrStopNamespaceRolledBack = &StopError{Reason: StopNamespaceRolledBack}
)

// Why StartEmbedded refused a grant (the fail-fast rules). A *GrantError
// wraps one of these; the grant was released before StartEmbedded returned.
var (
	// ErrGrantBadLayout: the grant's layout fails Layout.Validate.
	ErrGrantBadLayout = errors.New("the server granted an invalid layout")
	// ErrGrantMachineIDOutOfRange: a machine id does not fit the machine bits.
	ErrGrantMachineIDOutOfRange = errors.New("the server granted a machine id outside the machine bits")
	// ErrGrantCount: the grant holds another number of machine ids than
	// asked, or lists one machine id twice.
	ErrGrantCount = errors.New("the server granted another number of machine ids than asked")
	// ErrGrantExpired: the grant was already expired (expires_in_ms 0, or
	// its lease ended by the local clock before the answer arrived).
	ErrGrantExpired = errors.New("the grant was already expired by the local clock")
	// ErrGrantClockPastFence: the local clock is already past a granted
	// fence (ahead of the server's by more than the lease covers).
	ErrGrantClockPastFence = errors.New("the local clock is past the granted fence")
	// ErrGrantClockBehindFloor: the local clock is behind the granted floor
	// by more than EmbeddedConfig.MaxFloorWait (or the lease).
	ErrGrantClockBehindFloor = errors.New("the local clock is behind the granted floor")
)

// GrantError is StartEmbedded's refusal of a grant it cannot use: Kind is
// one of the ErrGrant* values (errors.Is matches it), Detail says more. The
// machine ids were released before it was returned. Its gRPC code is
// FAILED_PRECONDITION (Retryable false: the same server answers the same).
type GrantError struct {
	Kind   error
	Detail string
	// Wait and Max: how far behind the floor the clock is and the most a
	// start waits (ErrGrantClockBehindFloor); Wait is how far past the
	// fence it is (ErrGrantClockPastFence).
	Wait, Max time.Duration
}

// Error names the refused grant's fault and says the grant was released.
func (e *GrantError) Error() string {
	return "snowkeep: " + e.Kind.Error() + ": " + e.Detail + "; the machine ids were released"
}

// Unwrap gives Kind, for errors.Is.
func (e *GrantError) Unwrap() error { return e.Kind }

// GRPCStatus: FAILED_PRECONDITION.
func (e *GrantError) GRPCStatus() *status.Status {
	return status.New(codes.FailedPrecondition, e.Error())
}
