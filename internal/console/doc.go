// Package console is the web console of `idemq console`: dead-letter
// queues with their depth, their dead letters grouped by cause, a dead
// letter's detail, replay (to the failed work queue only), archive and
// purge of one message, a group or a whole queue with a confirmation step
// and progress; dedup-key lookup and forget; outbox pending and failed
// rows with retry; live queue depths and rates sampled by the console.
//
// It is a thin layer: what it does to dead letters is the deadletter
// package's, to dedup records the dedup package's (dedup.ForgetKey), to
// outbox rows the outbox store's, through the small [Outbox] interface.
//
// Security: [Config.Validate] refuses a listen address other than loopback
// without a token; with a token every request must carry it (a cookie set
// by the login form or ?token=, or an Authorization: Bearer header). Every
// state change is a POST that must carry the CSRF token of its page (a
// double-submit cookie), and is refused cross-origin
// (net/http.CrossOriginProtection). Without a token the Host header must be
// a loopback name (no DNS rebinding). A read-only console refuses every
// state change. No URL password or DSN secret is rendered; every action
// and refusal is one slog line.
//
// Pages are server-rendered html/template with no script; templates and
// the style sheet are embedded, so it works offline.
package console
