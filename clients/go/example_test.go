package snowkeep_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"google.golang.org/grpc/codes"

	snowkeep "example.invalid/snowkeep/clients/go"
)

func ExampleNew() {
	c, err := snowkeep.New([]string{"127.0.0.1:50051", "127.0.0.1:50052"},
		snowkeep.WithAPIKey("kid.secret"))
	if err != nil {
		log.Fatal(err) // an INVALID_ARGUMENT *snowkeep.Error naming the parameter
	}
	defer c.Close()
	ids, err := c.NextIDs(context.Background(), 10)
	var e *snowkeep.Error
	if errors.As(err, &e) && e.Code() == codes.PermissionDenied {
		log.Fatal("the key lacks the ids permission: ", e.Message())
	}
	fmt.Println(ids)
}

func ExampleClient_NewPool() {
	c, err := snowkeep.New([]string{"127.0.0.1:50051"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	p, err := c.NewPool(snowkeep.WithPoolBatch(1000), snowkeep.WithPoolLowWater(250))
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	id, err := p.Next(context.Background())
	fmt.Println(id, err)
}

func ExampleLayout_Decode() {
	l := snowkeep.Layout{TimestampBits: 41, MachineBits: 12, SequenceBits: 10,
		EpochUnixMs: 1767225600000, TimeUnitMs: 1}
	d, _ := l.Decode(1000<<22 | 7<<10 | 3)
	fmt.Println(d.UnixMs, d.MachineID, d.Sequence)
	// Output: 1767225601000 7 3
}
