package snowkeep

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"

	pb "example.invalid/snowkeep/clients/go/gen/snowkeepv1"
)

// Layout is the bit layout of a namespace's ids, as InfoService.GetInfo
// reports it: from the most significant bit, TimestampBits of timestamp
// (ticks of TimeUnitMs since EpochUnixMs), then MachineBits of machine id,
// then SequenceBits of sequence.
type Layout struct {
	TimestampBits uint32
	MachineBits   uint32
	SequenceBits  uint32
	// EpochUnixMs is the layout's epoch in milliseconds since the Unix epoch.
	EpochUnixMs uint64
	// TimeUnitMs is the tick of the timestamp field in milliseconds (1, 10,
	// 100 or 1000); a server that reports 0 means 1.
	TimeUnitMs uint32
}

// DecodedID holds the parts of one id.
type DecodedID struct {
	// UnixMs is the id's timestamp in milliseconds since the Unix epoch
	// (EpochUnixMs + ticks × TimeUnitMs: the first millisecond of its tick).
	UnixMs uint64
	// MachineID is the machine id field.
	MachineID uint32
	// Sequence is the sequence within the tick.
	Sequence uint32
}

// MaxID is the largest id of the layout: 2^(bits in all) - 1.
func (l Layout) MaxID() uint64 {
	total := l.TimestampBits + l.MachineBits + l.SequenceBits
	if total >= 64 {
		return ^uint64(0)
	}
	return 1<<total - 1
}

// Decode splits id into its parts. An id above MaxID fails with an
// INVALID_ARGUMENT *Error naming id.
func (l Layout) Decode(id uint64) (DecodedID, error) {
	if id > l.MaxID() {
		return DecodedID{}, invalidArg("id %d is above the layout's largest id %d", id, l.MaxID())
	}
	unit := uint64(l.TimeUnitMs)
	if unit == 0 {
		unit = 1
	}
	seqMask := uint64(1)<<l.SequenceBits - 1
	machMask := uint64(1)<<l.MachineBits - 1
	ticks := id >> (l.MachineBits + l.SequenceBits)
	return DecodedID{
		UnixMs:    l.EpochUnixMs + ticks*unit,
		MachineID: uint32((id >> l.SequenceBits) & machMask),
		Sequence:  uint32(id & seqMask),
	}, nil
}

// Layout returns the layout the servers report (InfoService.GetInfo, called
// under the retry rule on the first use and cached for the client's life).
func (c *Client) Layout(ctx context.Context) (Layout, error) {
	c.layoutMu.Lock()
	cached := c.layout
	c.layoutMu.Unlock()
	if cached != nil {
		return *cached, nil
	}
	info, err := call(ctx, c, func(ctx context.Context, s *server) (*pb.GetInfoResponse, error) {
		return s.info.GetInfo(ctx, &pb.GetInfoRequest{})
	})
	if err != nil {
		return Layout{}, err
	}
	pl := info.GetLayout()
	if pl == nil || pl.GetTimestampBits()+pl.GetMachineBits()+pl.GetSequenceBits() == 0 {
		return Layout{}, &Error{code: codes.FailedPrecondition,
			msg: "the server reported no layout (with API keys on, GetInfo needs a key)"}
	}
	l := Layout{
		TimestampBits: pl.GetTimestampBits(), MachineBits: pl.GetMachineBits(),
		SequenceBits: pl.GetSequenceBits(), EpochUnixMs: pl.GetEpochUnixMs(),
		TimeUnitMs: max(pl.GetTimeUnitMs(), 1),
	}
	c.layoutMu.Lock()
	c.layout = &l
	c.layoutMu.Unlock()
	return l, nil
}

// Decode splits id into Unix milliseconds, machine id and sequence under the
// layout the servers report (see Layout). Errors: those of Layout, and an
// INVALID_ARGUMENT *Error naming id for an id above the layout's largest.
func (c *Client) Decode(ctx context.Context, id uint64) (DecodedID, error) {
	l, err := c.Layout(ctx)
	if err != nil {
		return DecodedID{}, err
	}
	return l.Decode(id)
}

// Validate checks the layout the way the server and the Rust client do:
// each bit count positive, 32 to 63 bits in all (the sign bit stays 0), at
// most 16 machine bits, and a time unit of 1, 10, 100 or 1000 ms (0 counts as
// 1, a server from before time units). It returns nil or a FAILED_PRECONDITION
// *Error saying which rule the layout breaks. The embedded generator refuses
// a grant whose layout fails it (see ErrGrantBadLayout).
func (l Layout) Validate() error {
	sum := uint64(l.TimestampBits) + uint64(l.MachineBits) + uint64(l.SequenceBits)
	if l.TimestampBits == 0 || l.MachineBits == 0 || l.SequenceBits == 0 || sum < 32 || sum > 63 {
		return &Error{code: codes.FailedPrecondition, msg: fmt.Sprintf(
			"layout bits must each be positive and sum to 32..63, got timestamp %d + machine %d + sequence %d",
			l.TimestampBits, l.MachineBits, l.SequenceBits)}
	}
	if l.MachineBits > 16 {
		return &Error{code: codes.FailedPrecondition,
			msg: fmt.Sprintf("machine_bits is %d, at most 16 are supported", l.MachineBits)}
	}
	switch l.unitMs() {
	case 1, 10, 100, 1000:
		return nil
	}
	return &Error{code: codes.FailedPrecondition,
		msg: fmt.Sprintf("time unit %d ms is not supported: use 1, 10, 100 or 1000 ms", l.TimeUnitMs)}
}

// Encode packs a timestamp (layout ms: ms since EpochUnixMs, stored as the
// tick ms / TimeUnitMs), a machine id and a sequence into an id. The caller
// keeps each part in range: ms at or below the layout's last timestamp,
// machineID below 2^MachineBits, sequence below 2^SequenceBits.
func (l Layout) Encode(ms uint64, machineID uint32, sequence uint64) uint64 {
	return (ms/l.unitMs())<<(l.MachineBits+l.SequenceBits) |
		uint64(machineID)<<l.SequenceBits | sequence
}

// unitMs is the time unit in ms, 0 read as 1.
func (l Layout) unitMs() uint64 { return uint64(max(l.TimeUnitMs, 1)) }

// perTick is 2^SequenceBits: ids per tick per machine id.
func (l Layout) perTick() uint64 { return 1 << l.SequenceBits }

// maxTimestamp is the last layout ms an id can carry: the last ms of tick
// 2^TimestampBits - 1.
func (l Layout) maxTimestamp() uint64 { return (1<<l.TimestampBits)*l.unitMs() - 1 }

// tickStart is ms rounded down to its tick's first ms.
func (l Layout) tickStart(ms uint64) uint64 { return ms - ms%l.unitMs() }

// firstStampAfter is the first layout ms a holder with floor may stamp: the
// first ms of the tick after the floor's (floor+1 at 1 ms units).
func (l Layout) firstStampAfter(floor uint64) uint64 { return l.tickStart(floor) + l.unitMs() }

// layoutFromPB reads a layout a server sent (0 time unit: 1 ms).
func layoutFromPB(p *pb.Layout) Layout {
	return Layout{
		TimestampBits: p.GetTimestampBits(), MachineBits: p.GetMachineBits(),
		SequenceBits: p.GetSequenceBits(), EpochUnixMs: p.GetEpochUnixMs(),
		TimeUnitMs: max(p.GetTimeUnitMs(), 1),
	}
}
