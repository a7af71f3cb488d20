package inbox_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/business"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/sqldb/postgres"
)

// The inbox over a pgx pool: the handler receives the pgx.Tx of the inbox
// row, runs its effect in it and hands it to the business helpers the one
// way, postgres.PgxTx. The inbox table's migrations are applied by New.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	ib, err := inbox.New(ctx, postgres.Pgx(pool), inbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	orders, err := business.NewMachine(postgres.Dialect(), "orders", "id", "state")
	if err != nil {
		log.Fatal(err)
	}
	handler := ib.Handler(func(ctx context.Context, tx pgx.Tx, d *idemq.Delivery) error {
		if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, 10, "a-1"); err != nil {
			return err
		}
		return orders.Transition(ctx, postgres.PgxTx(tx), string(d.Body), "new", "paid")
	})
	_ = handler // idemq.NewConsumer(cfg, handler)
}
