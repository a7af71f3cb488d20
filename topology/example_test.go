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
		fmt.Println(r.Name, r.Args[topology.ArgMessageTTL])
	}
	// Output:
	// orders.dlq 20
	// orders.retry.1000 1000
	// orders.retry.5000 5000
	// orders.retry.30000 30000
	// orders.retry.120000 120000
	// orders.retry.600000 600000
}
