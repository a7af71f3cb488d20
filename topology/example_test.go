package topology_test

import (
	"fmt"
	"testing"

	"github.com/idemq/idemq/topology"
)

func TestExampleFileLoads(t *testing.T) {
	top, err := topology.LoadFile("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Queues) != 2 || len(top.Bindings) != 2 {
		t.Fatalf("%+v", top)
	}
}

func ExampleForQueue() {
	p := topology.ForQueue(topology.Queue{Name: "orders", Type: topology.Quorum})
	fmt.Println(p.DLQ, p.DeliveryLimit)
	for _, r := range p.Retries {
		fmt.Println(r.Name, r.Delay, r.Args[topology.ArgMessageTTL] != nil)
	}
	// Output:
	// orders.dlq 20
	// orders.retry.1000 1s false
	// orders.retry.5000 5s false
	// orders.retry.30000 30s false
	// orders.retry.120000 2m0s false
	// orders.retry.600000 10m0s false
}
