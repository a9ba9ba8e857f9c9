// Command quickstart takes ids from a snowkeep server in the three ways the
// Go client offers (a batch, a stream, a pool) and decodes one.
//
//	go run ./examples/quickstart [endpoint ...]   (default 127.0.0.1:50051)
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	snowkeep "example.invalid/snowkeep/clients/go"
)

func main() {
	endpoints := os.Args[1:]
	if len(endpoints) == 0 {
		endpoints = []string{"127.0.0.1:50051"}
	}
	c, err := snowkeep.New(endpoints, snowkeep.WithRetryBudget(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ids, err := c.NextIDs(ctx, 5)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("next_ids:", ids)

	s, err := c.Stream(ctx, 10000, 1000)
	if err != nil {
		log.Fatal(err)
	}
	for batch, err := range s.All() {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("stream: %d ids, last %d\n", len(batch), batch[len(batch)-1])
	}

	p, err := c.NewPool(snowkeep.WithPoolBatch(1000))
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	id, err := p.Next(ctx)
	if err != nil {
		log.Fatal(err)
	}
	d, err := c.Decode(ctx, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("pool: %d = %s, machine %d, sequence %d\n", id,
		time.UnixMilli(int64(d.UnixMs)).UTC().Format(time.RFC3339Nano), d.MachineID, d.Sequence)
}
