package main

import (
	"context"
	"errors"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq"
)

// The transient failures the demo injects are a function of the message
// ID: about rate of the transfers, half failing once, half twice; every
// attempt up to that count fails (and is counted), none after it.
func TestTransientFailures(t *testing.T) {
	const n, rate = 20000, 0.1
	var once, twice int
	for i := 0; i < n; i++ {
		switch transientFailures(fmt.Sprintf("t-0123abcd-%d", i), rate) {
		case 1:
			once++
		case 2:
			twice++
		}
	}
	if got := float64(once+twice) / n; got < 0.09 || got > 0.11 {
		t.Errorf("%d of %d IDs fail at rate %g (%.3f)", once+twice, n, rate, got)
	}
	if once < (once+twice)*4/10 || twice < (once+twice)*4/10 {
		t.Errorf("%d fail once, %d twice: want about half each", once, twice)
	}
	if k := transientFailures("t-x-1", 0); k != 0 {
		t.Errorf("rate 0: %d failures", k)
	}
	if k := transientFailures("t-x-1", 1); k != 1 && k != 2 {
		t.Errorf("rate 1: %d failures", k)
	}

	var c idemq.Counters
	ctx := idemq.WithRecorder(context.Background(), &c)
	id := ""
	for i := 0; id == ""; i++ {
		if transientFailures(fmt.Sprint("t-y-", i), 0.5) == 2 {
			id = fmt.Sprint("t-y-", i)
		}
	}
	for attempt, wantFail := range map[int]bool{1: true, 2: true, 3: false, 4: false} {
		d := &idemq.Delivery{MessageID: id, Headers: amqp.Table{idemq.HeaderAttempt: int64(attempt)}}
		err := failTransiently(ctx, d, 0.5)
		if (err != nil) != wantFail || (err != nil && !errors.Is(err, errTransient)) {
			t.Errorf("attempt %d: err %v, want failure %v", attempt, err, wantFail)
		}
		if err != nil && (idemq.IsPermanent(err) || idemq.IsUnavailable(err)) {
			t.Errorf("attempt %d: %v is not an ordinary transient error", attempt, err)
		}
	}
	if got := c.Get(countTransient); got != 2 {
		t.Errorf("%s = %d, want 2", countTransient, got)
	}
}
