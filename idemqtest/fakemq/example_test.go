package fakemq_test

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/idemqtest/fakemq"
)

// A message rejected without requeue goes to the dead-letter queue with
// an x-death entry, as on RabbitMQ. An idemq Consumer or Publisher takes
// b.Dial as its Dial the same way.
func Example() {
	b := fakemq.New(fakemq.Config{})
	defer b.Close()

	conn, err := b.Dial("amqp://guest:guest@fake/", amqp.Config{})
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	_, _ = ch.QueueDeclare("orders.dlq", true, false, false, false, nil)
	_, _ = ch.QueueDeclare("orders", true, false, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "orders.dlq"})

	_ = ch.PublishWithContext(context.Background(), "", "orders", false, false,
		amqp.Publishing{MessageId: "o-1", Body: []byte("bad order")})
	d, _, _ := ch.Get("orders", false)
	_ = d.Reject(false)

	dl, _, _ := ch.Get("orders.dlq", false)
	death := dl.Headers["x-death"].([]any)[0].(amqp.Table)
	fmt.Println(dl.MessageId, death["reason"], death["queue"], death["count"])
	info, _ := b.Queue("orders")
	fmt.Println("orders ready:", info.Ready, "unacked:", info.Unacked)
	// Output:
	// o-1 rejected orders 1
	// orders ready: 0 unacked: 0
}
