package outbox_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
	"github.com/idemq/idemq/sqldb/mysql"
)

// Adding to the outbox inside a database/sql transaction: the one way to
// hand idemq a *sql.Tx is sqldb.StdTx (a pgx.Tx: postgres.PgxTx).
func ExampleSQLStore_Add() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	store, err := outbox.NewStore(ctx, mysql.Std(db), outbox.StoreConfig{}) // applies the table's migrations
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	// … the business write …
	if err := store.Add(ctx, sqldb.StdTx(tx), outbox.Message{ID: "order-42-created", RoutingKey: "orders.created", Body: []byte(`{}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil { // the message exists only if this commits
		log.Fatal(err)
	}
}
