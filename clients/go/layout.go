package snowkeep

import (
	"context"

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
