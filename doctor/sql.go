package doctor

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup/sqlstore"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/sqldb"
)

func sqlFindings(ctx context.Context, cfg Config) []Finding {
	subject := "sql " + cfg.DB.Dialect().Name
	if err := cfg.DB.QueryRow(ctx, "SELECT 1").Scan(new(int)); err != nil {
		return []Finding{{Check: "sql.reach", Subject: subject, Status: Fail, Detail: err.Error(),
			Meaning: "the inbox, the outbox or the SQL dedup store cannot run: consumers pause, the relay waits",
			Fix:     "check the database URL (--db) and that the database runs"}}
	}
	var schemas []sqldb.Schema
	if cfg.DedupTable != "" {
		schemas = append(schemas, sqlstore.Schema(cfg.DedupTable))
	}
	if cfg.InboxTable != "" {
		schemas = append(schemas, inbox.Schema(cfg.InboxTable))
	}
	if cfg.OutboxTable != "" {
		schemas = append(schemas, outbox.Schema(cfg.OutboxTable))
	}
	var out []Finding
	pendingOutbox := false
	for _, s := range schemas {
		st, err := sqldb.Status(ctx, cfg.DB, s)
		if err != nil || len(st) != 1 {
			out = append(out, Finding{Check: "sql.migrations", Subject: s.Component + " " + s.Table, Status: Fail,
				Detail: fmt.Sprintf("could not read the migrations: %v", err), Fix: "idemq migrate status --db URL"})
			continue
		}
		f := Finding{Check: "sql.migrations", Subject: st[0].Component + " " + st[0].Table, Status: Pass,
			Detail: fmt.Sprintf("at version %d of %d", st[0].Current(), s.Latest())}
		if len(st[0].Pending) > 0 {
			f.Status = Fail
			f.Detail += fmt.Sprintf(", pending %v", st[0].Pending)
			f.Meaning = "processes started with NoMigrate run statements the table does not support yet; those without it apply the migrations at start"
			f.Fix = fmt.Sprintf("idemq migrate up --db URL --only %s", s.Component)
			if s.Component == outbox.Component {
				pendingOutbox = true
			}
		}
		out = append(out, f)
	}
	if cfg.OutboxTable != "" && !pendingOutbox {
		out = append(out, outboxFindings(ctx, cfg)...)
	}
	return out
}

// outboxFindings reads the outbox's lag (its oldest pending row) and its
// failed rows.
func outboxFindings(ctx context.Context, cfg Config) []Finding {
	subject := "outbox " + cfg.OutboxTable
	st, err := outbox.NewStore(ctx, cfg.DB, outbox.StoreConfig{Table: cfg.OutboxTable, NoMigrate: true})
	if err != nil {
		return []Finding{{Check: "sql.outbox", Subject: subject, Status: Fail, Detail: err.Error()}}
	}
	var out []Finding
	stats, err := st.Stats(ctx)
	if err != nil {
		return []Finding{{Check: "sql.outbox-lag", Subject: subject, Status: Fail, Detail: err.Error()}}
	}
	f := Finding{Check: "sql.outbox-lag", Subject: subject, Status: Pass,
		Detail: fmt.Sprintf("%d pending, oldest %v", stats.Pending, stats.Lag.Round(time.Second))}
	switch {
	case stats.Lag >= cfg.OutboxLagFail:
		f.Status = Fail
	case stats.Lag >= cfg.OutboxLagWarn:
		f.Status = Warn
	}
	if f.Status != Pass {
		f.Meaning = "messages committed with the business change are not published: no relay runs, or it cannot keep up or reach the broker"
		f.Fix = "run idemq relay for this table (idemq relay --db URL --table " + cfg.OutboxTable + "), and check its log and metrics"
	}
	out = append(out, f)
	counts, err := st.Count(ctx)
	if err != nil {
		return append(out, Finding{Check: "sql.outbox-failed", Subject: subject, Status: Fail, Detail: err.Error()})
	}
	ff := Finding{Check: "sql.outbox-failed", Subject: subject, Status: Pass, Detail: fmt.Sprintf("%d failed rows", counts[outbox.StateFailed])}
	if counts[outbox.StateFailed] > 0 {
		ff.Status = Warn
		ff.Meaning = "the relay gave up on these messages (unroutable, too large, invalid): they are not published until an operator decides"
		ff.Fix = "idemq outbox list --db URL, then idemq outbox retry or skip ROW-ID for each"
	}
	return append(out, ff)
}
