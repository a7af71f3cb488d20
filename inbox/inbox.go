package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/sqldb"
)

// DefaultTable is the inbox table's default name.
const DefaultTable = "idemq_inbox"

// MaxGroupLength bounds a consumer group name in bytes (the column width).
const MaxGroupLength = 255

// Config configures an [Inbox]. The zero value is usable.
type Config struct {
	// Table is the inbox table ([sqldb.Dialect.CheckTable]). Default
	// [DefaultTable].
	Table string
	// Group is the consumer group the rows are keyed by. Default: the
	// delivery's Group (the consumer's ConsumerConfig.Group).
	Group string
	// Window is how long inbox rows are kept (the dedup window): a
	// duplicate arriving later than this is processed again. Default 7
	// days.
	Window time.Duration
	// RetryHorizon is the longest time a message can come back after its
	// first delivery (retry delays, dead-letter replays you intend to
	// dedup). A Window shorter than it is rejected by [New]. Default 0 (no
	// check).
	RetryHorizon time.Duration
	// PurgeInterval is how often [Inbox.RunPurger] purges. Default 1 minute.
	PurgeInterval time.Duration
	// PurgeBatch is the number of rows deleted per statement (and
	// transaction) when purging. Default 1000.
	PurgeBatch int
	// NoMigrate: [New] does not apply the table's migrations (the schema
	// is managed elsewhere, e.g. by `idemq migrate up`; see [Schema] for
	// the DDL it expects). Default false: it applies the pending ones.
	NoMigrate bool
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Observer is told each transaction's path, result and latency, each
	// batch's size and each savepoint fallback ([Observer];
	// metrics.Metrics.Inbox). Default: none.
	Observer Observer
}

// Errors from the inbox.
var (
	// ErrInvalidConfig is wrapped by every error [New] returns for a
	// Config it refuses.
	ErrInvalidConfig = idemq.ConfigErrorClass("inbox: invalid config")
	// ErrWindowTooShort: Config.Window is shorter than Config.RetryHorizon,
	// so a retried message could find its inbox row purged and run twice.
	// It wraps [ErrInvalidConfig].
	ErrWindowTooShort = fmt.Errorf("%w: retention window shorter than the retry horizon", ErrInvalidConfig)
	// ErrInvalidGroup: an empty group name or one longer than
	// MaxGroupLength bytes.
	ErrInvalidGroup = errors.New("inbox: invalid consumer group")
)

// HandlerFunc is the business handler: it runs inside the inbox
// transaction tx and must do all its database work through tx. It must not
// commit or roll back tx. A nil return commits; an error rolls back and is
// returned to the failure policy unchanged (wrap with %w to keep
// [idemq.Permanent] or [idemq.Requeue] visible). In a batch ([Batcher]) it
// may be called twice for one delivery, the first call's transaction
// having been rolled back.
type HandlerFunc[T any] func(ctx context.Context, tx T, d *idemq.Delivery) error

// Inbox writes one row per (group, message ID) in the same transaction as
// the handler's effect. Create it with [New].
type Inbox[T any] struct {
	db  sqldb.Native[T]
	d   *sqldb.Dialect
	cfg Config
	st  statements
	log *slog.Logger
}

// New validates cfg, fills its defaults, applies the table's pending
// migrations unless cfg.NoMigrate, and returns the inbox on db:
// postgres.Pgx(pool) (the handler receives a pgx.Tx), postgres.Std(db),
// mysql.Std(db), sqlite.Std(db) (a *sql.Tx). The caller keeps owning db.
func New[T any](ctx context.Context, db sqldb.Native[T], cfg Config) (*Inbox[T], error) {
	if db == nil {
		return nil, errors.New("inbox: nil DB")
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if cfg.Window <= 0 {
		cfg.Window = 7 * 24 * time.Hour
	}
	if cfg.RetryHorizon > 0 && cfg.Window < cfg.RetryHorizon {
		return nil, fmt.Errorf("%w: Window %v < RetryHorizon %v: a message retried after %v would find its inbox row purged and apply its effect again; raise Window to at least %v",
			ErrWindowTooShort, cfg.Window, cfg.RetryHorizon, cfg.Window, cfg.RetryHorizon)
	}
	if cfg.Group != "" {
		if err := validGroup(cfg.Group); err != nil {
			return nil, fmt.Errorf("%w: Group: %w", ErrInvalidConfig, err)
		}
	}
	if cfg.PurgeInterval <= 0 {
		cfg.PurgeInterval = time.Minute
	}
	if cfg.PurgeBatch <= 0 {
		cfg.PurgeBatch = 1000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	st, err := compile(db.Dialect(), cfg.Table)
	if err != nil {
		return nil, err
	}
	ib := &Inbox[T]{db: db, d: db.Dialect(), cfg: cfg, st: st, log: cfg.Logger.With("inbox", cfg.Table)}
	if !cfg.NoMigrate {
		if err := ib.Migrate(ctx); err != nil {
			return nil, err
		}
	}
	return ib, nil
}

func validGroup(g string) error {
	if g == "" || len(g) > MaxGroupLength {
		return fmt.Errorf("%w: %d bytes (1..%d allowed)", ErrInvalidGroup, len(g), MaxGroupLength)
	}
	return nil
}

// DB returns the inbox's database.
func (ib *Inbox[T]) DB() sqldb.Native[T] { return ib.db }

// Config returns the effective configuration (defaults filled).
func (ib *Inbox[T]) Config() Config { return ib.cfg }

// Migrate applies the table's pending migrations ([Schema]). It is safe to
// run from many processes at once.
func (ib *Inbox[T]) Migrate(ctx context.Context) error {
	if _, err := sqldb.Up(ctx, ib.db, 0, Schema(ib.cfg.Table)); err != nil {
		return Classify(fmt.Errorf("inbox: migrate %s: %w", ib.cfg.Table, err))
	}
	return nil
}

// key returns the (group, id) of a delivery or a reject error.
func (ib *Inbox[T]) key(d *idemq.Delivery) (group, id string, err error) {
	group = ib.cfg.Group
	if group == "" {
		group = d.Group
	}
	if err := validGroup(group); err != nil {
		return "", "", idemq.Reject(idemq.ReasonInvalidID, err)
	}
	// The consumer decided the ID (ConsumerConfig.ID): the inbox keys on
	// the same value as the guard and every other layer.
	id, err = d.ID()
	if err != nil {
		return "", "", err
	}
	return group, id, nil
}

// insert writes the inbox row in tx; false means it was already there.
// Only a duplicate key means that: any other refusal of the row (a value
// too long for a user-managed column, a CHECK constraint, ...) is an error.
func (ib *Inbox[T]) insert(ctx context.Context, tx sqldb.Tx, group, id string) (bool, error) {
	n, err := tx.Exec(ctx, ib.st.insert.SQL, ib.st.insert.Args(group, id, ib.d.Time(ib.cfg.Now()))...)
	if err != nil {
		if ib.isDuplicate(err) {
			return false, nil
		}
		return false, Classify(fmt.Errorf("inbox: insert row: %w", err))
	}
	return n > 0, nil
}

// isDuplicate reports whether err is an insert failing on an existing row
// (dialects whose insert does not skip it).
func (ib *Inbox[T]) isDuplicate(err error) bool {
	return ib.st.dupIsError && ib.d.IsDuplicateKey(err)
}

// Handler returns the innermost idemq handler: per delivery it begins a
// transaction, inserts the inbox row, and
//   - row already there (a duplicate, committed by someone else): rolls
//     back and returns [idemq.ErrDuplicate] without running h (the
//     consumer acks it and counts a duplicate);
//   - row inserted: runs h(ctx, tx, d); nil → commit, return nil (the
//     consumer acks it and counts it processed); error → roll back,
//     return it.
//
// A second delivery of an ID whose row is still uncommitted blocks on it
// (PostgreSQL and MySQL wait on the unique index, SQLite on the write
// lock): it is acked as a duplicate once the first commits, and runs if the
// first rolls back. A missing or invalid ID is rejected
// ([idemq.ReasonMissingID], [idemq.ReasonInvalidID]).
//
// The handler is an [idemq.Prober]: the consumer adds the inbox's
// [Inbox.Probe] to its breaker's probes.
func (ib *Inbox[T]) Handler(h HandlerFunc[T]) idemq.Handler {
	return &handler[T]{ib: ib, h: h}
}

// handler is [Inbox.Handler]'s handler.
type handler[T any] struct {
	ib *Inbox[T]
	h  HandlerFunc[T]
}

func (x *handler[T]) Handle(ctx context.Context, d *idemq.Delivery) error {
	return x.ib.handle(ctx, x.h, d)
}

// Probe is the inbox's [Inbox.Probe] (idemq.Prober).
func (x *handler[T]) Probe(ctx context.Context) error { return x.ib.Probe(ctx) }

// DedupWindow implements [idemq.Windowed]: Config.Window.
func (x *handler[T]) DedupWindow() time.Duration { return x.ib.cfg.Window }

var _ idemq.Prober = (*handler[any])(nil)

func (ib *Inbox[T]) handle(ctx context.Context, h HandlerFunc[T], d *idemq.Delivery) (err error) {
	group, id, err := ib.key(d)
	if err != nil {
		return err
	}
	start := time.Now()
	result := ResultFailed
	defer func() { ib.cfg.Observer.Transaction(PathSingle, result, time.Since(start)) }()
	native, tx, err := ib.db.BeginNative(ctx)
	if err != nil {
		return Classify(fmt.Errorf("inbox: begin: %w", err))
	}
	done := false
	defer func() {
		if !done {
			// A panic in h (re-raised to the Recover middleware) or an
			// early return: never leave the transaction open.
			_ = sqldb.Rollback(ctx, tx)
		}
	}()
	fresh, err := ib.insert(ctx, tx, group, id)
	if err != nil {
		return err
	}
	if !fresh {
		done = true
		_ = tx.Rollback(ctx)
		result = ResultRolledBack
		ib.log.Debug("inbox: duplicate acked", "group", group, "message_id", id)
		return idemq.Duplicate(idemq.LayerInbox)
	}
	result = ResultRolledBack // unless it commits: the handler failed or panicked
	if err := h(ctx, native, d); err != nil {
		done = true
		if rbErr := sqldb.Rollback(ctx, tx); rbErr != nil {
			ib.log.Warn("inbox: rollback after handler error failed", "message_id", id, "err", rbErr)
			result = ResultFailed
		}
		return Classify(err) // a lost connection is not the message's fault
	}
	done = true
	if err := tx.Commit(ctx); err != nil {
		result = ResultFailed
		return Classify(fmt.Errorf("inbox: commit: %w", err))
	}
	result = ResultCommitted
	return nil
}
