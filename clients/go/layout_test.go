package snowkeep

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	pb "example.invalid/snowkeep/clients/go/gen/snowkeepv1"
)

const epoch = 1_767_225_600_000

func TestDecodeUsesTheReportedLayoutOnce(t *testing.T) {
	f := newFake(t, 0)
	f.layout = &pb.Layout{TimestampBits: 41, MachineBits: 12, SequenceBits: 10, EpochUnixMs: epoch}
	c := mustNew(t, []string{f.url()})
	ctx := context.Background()
	id := uint64(123456)<<22 | 4095<<10 | 1023
	d, err := c.Decode(ctx, id)
	if err != nil || d != (DecodedID{UnixMs: epoch + 123456, MachineID: 4095, Sequence: 1023}) {
		t.Fatalf("%+v %v", d, err)
	}
	if d, err = c.Decode(ctx, 1<<63-1); err != nil || d.UnixMs != epoch+1<<41-1 {
		t.Fatalf("%+v %v", d, err)
	}
	if f.infoCalls.Load() != 1 {
		t.Fatalf("GetInfo calls %d", f.infoCalls.Load())
	}
}

func TestDecodeWithTicksAndTheTopOfA53BitLayout(t *testing.T) {
	l := Layout{TimestampBits: 39, MachineBits: 6, SequenceBits: 8, EpochUnixMs: epoch, TimeUnitMs: 10}
	d, err := l.Decode(7<<14 | 63<<8 | 5)
	if err != nil || d != (DecodedID{UnixMs: epoch + 70, MachineID: 63, Sequence: 5}) {
		t.Fatalf("%+v %v", d, err)
	}
	_, err = l.Decode(1 << 53)
	wantCode(t, err, codes.InvalidArgument, "id 9007199254740992 is above the layout's largest id 9007199254740991")
	if l0 := (Layout{TimestampBits: 41, MachineBits: 12, SequenceBits: 10}); l0.MaxID() != 1<<63-1 {
		t.Fatal(l0.MaxID())
	}
}
