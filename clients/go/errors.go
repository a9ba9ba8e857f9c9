package snowkeep

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is the typed error of every snowkeep call: a gRPC status code and a
// message. Errors the server sends carry its code and message unchanged;
// errors the client raises itself carry INVALID_ARGUMENT (a bad count,
// endpoint, API key, TLS file or id, refused before any call) or
// FAILED_PRECONDITION (a closed client or pool).
//
// Use errors.As to get at it, or status.Code(err) for the code alone (Error
// implements GRPCStatus). A cancellation or deadline of the caller's own
// context is never an *Error: calls return ctx.Err() for it.
type Error struct {
	code codes.Code
	msg  string
	// final marks an error no retry heals although its code is on the
	// retry list (a closed client or pool).
	final bool
}

// Code is the gRPC status code, e.g. codes.Unavailable.
func (e *Error) Code() codes.Code { return e.code }

// Message is the server's message, or the client's own for errors it raises.
func (e *Error) Message() string { return e.msg }

// Error formats the error as "snowkeep: CODE: message", CODE being the
// canonical upper snake case name (see CodeName).
func (e *Error) Error() string {
	return "snowkeep: " + CodeName(e.code) + ": " + e.msg
}

// GRPCStatus makes status.Code and status.FromError see the code and message.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.code, e.msg) }

// Retryable reports whether the same call may succeed later or on another
// server: the code is on the retry list (see IsRetryableCode), except for
// ErrClientClosed and ErrPoolClosed, which no retry heals.
func (e *Error) Retryable() bool { return !e.final && IsRetryableCode(e.code) }

// ErrClientClosed is returned (FAILED_PRECONDITION, not Retryable) by every
// call on a Client after Close.
var ErrClientClosed = &Error{code: codes.FailedPrecondition, msg: "client closed", final: true}

// ErrPoolClosed is returned (FAILED_PRECONDITION, not Retryable) by Pool.Next
// after Pool.Close.
var ErrPoolClosed = &Error{code: codes.FailedPrecondition, msg: "pool closed", final: true}

func invalidArg(format string, args ...any) *Error {
	return &Error{code: codes.InvalidArgument, msg: fmt.Sprintf(format, args...)}
}

// IsRetryableCode reports whether a call that failed with code may succeed
// when sent again (to another server, or later). The list is the same in
// every snowkeep client: UNAVAILABLE, DEADLINE_EXCEEDED, UNKNOWN, CANCELLED,
// RESOURCE_EXHAUSTED, ABORTED, INTERNAL, FAILED_PRECONDITION and NOT_FOUND.
// Every other code surfaces at once.
func IsRetryableCode(code codes.Code) bool {
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Unknown, codes.Canceled,
		codes.ResourceExhausted, codes.Aborted, codes.Internal,
		codes.FailedPrecondition, codes.NotFound:
		return true
	}
	return false
}

var codeNames = map[codes.Code]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN",
	codes.InvalidArgument: "INVALID_ARGUMENT", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
	codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED",
	codes.OutOfRange: "OUT_OF_RANGE", codes.Unimplemented: "UNIMPLEMENTED",
	codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE", codes.DataLoss: "DATA_LOSS",
	codes.Unauthenticated: "UNAUTHENTICATED",
}

// CodeName is the canonical upper snake case name of a gRPC code, as the
// gRPC specification writes it ("INVALID_ARGUMENT", "CANCELLED", ...).
func CodeName(code codes.Code) string {
	if n, ok := codeNames[code]; ok {
		return n
	}
	return fmt.Sprintf("CODE_%d", uint32(code))
}

// fromRPC turns an attempt's error into an *Error. Errors that carry no
// gRPC status (a transport failure below gRPC) count as UNAVAILABLE.
func fromRPC(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{code: codes.DeadlineExceeded, msg: err.Error()}
	}
	s, ok := status.FromError(err)
	if !ok {
		return &Error{code: codes.Unavailable, msg: err.Error()}
	}
	return &Error{code: s.Code(), msg: s.Message()}
}
