// Package bloom is the Bloom tier of dedup: exact short-lived leases in a
// lease store (memory or Redis) plus a rotating, time-windowed Bloom filter
// of done keys, for dedup windows of billions of IDs at a few bytes each —
// without ever dropping a new message silently.
//
// # The filter
//
// The window W is split into G generations of L = ceil(W/G) (whole ms).
// The generation index is floor(unix ms / L), so every process agrees on
// it without coordination. Adds go to the current generation; a lookup
// reads the current one and the G before it (G+1 bitmaps). An ID added in
// generation i is found until generation i+G ends: at least G·L ≥ W, at
// most (G+1)·L. [Local] keeps the bitmaps in process (atomic bit ops);
// dedup/bloom/redisbloom keeps them in Redis.
//
// Sizing, from n = ExpectedIDs per window and P = FPRate:
//
//	a lookup errs if any of the G+1 generations errs:  P = 1-(1-p_g)^(G+1)
//	so each generation targets                          p_g = 1-(1-P)^(1/(G+1)) ≈ P/(G+1)
//	a generation holds                                  n_g = n/G IDs
//	bits per generation                                 m = -n_g·ln(p_g)/ln²2   (rounded up to 64)
//	hashes                                              k = round(m/n_g·ln 2)   (m grown until (1-e^(-k·n_g/m))^k ≤ p_g)
//	memory                                              (G+1)·m/8 bytes = (G+1)/G · -ln(p_g)/ln²2 / 8 bytes per ID
//
// With G = 4:
//
//	P = 1e-3: p_g = 2.0e-4, 17.7 bits per ID per generation, ×5/4 → 2.77 bytes per ID, k = 12
//	P = 1e-4: p_g = 2.0e-5, 22.5 bits,                        ×5/4 → 3.52 bytes per ID, k = 16
//	P = 1e-6: p_g = 2.0e-7, 32.1 bits,                        ×5/4 → 5.01 bytes per ID, k = 22
//
// against about 145 bytes for one exact Redis key with a TTL. The achieved
// rate is estimated from the fill ratio f_i (set bits / m, counted as bits
// flip) of each live generation: 1 - Π(1 - f_i^k) ([Stats], [Watch]).
//
// # The tiered store
//
// [Store] implements dedup.Store over any lease store and filter (memory
// leases and a [Local] filter for one process; Redis for many). For Redis,
// dedup/bloom/redisbloom.Store does the same with one script per call.
// The generic one:
//
//	Claim:    filter "definitely not"      → lease store Claim (Acquired / InFlight / Done)
//	          filter "maybe", verifier     → verifier done? Done : lease store Claim (a false positive, counted)
//	          filter "maybe", no verifier  → lease store Claim: Done (recent marker) / InFlight as is;
//	                                         Acquired is given back and *SuspectedDuplicateError returned
//	Complete: lease store Complete(min(window, Recent)) — the lease becomes an exact done marker,
//	          atomically, with the lease store's ownership rules — then MarkDone in the record of
//	          truth (if the verifier is one), then filter Add. A claim in between sees the marker.
//	Release, Extend: the lease store's.
//
// Trade-offs per configuration:
//
//   - verifier = the record of truth ([RecordOfTruth] over a SQL or exact
//     store): exact answers and exact per-call windows; the filter saves the
//     lookup of every new ID (the common case), not the write. Passes
//     dedup/storetest.
//   - verifier = a read-only check ([InspectorVerifier], [VerifierFunc] over
//     the inbox table written in the business transaction): exact, no extra
//     write; the filter answers new IDs, the inbox only the hits.
//   - no verifier: the cheapest (no authority at all). True duplicates
//     within Recent are answered exactly (the marker); older duplicates and
//     false positives are suspects, never Done and never run: make a
//     [Router] the pipeline's failure policy and they land in
//     "<queue>.suspected" with x-idemq-reason=suspected-duplicate, counted,
//     for an operator to replay. The suspect error wraps
//     dedup.ErrUncertain, so the dedup guard neither runs nor acks it even
//     with FailOpen: without the router the guard rejects it with reason
//     suspected-duplicate and the failure policy (a retry.Policy)
//     dead-letters it with that reason; the router only gives suspects
//     their own queue. This mode cannot pass the conformance suite, by
//     design: the suite wants Done for every duplicate, and this store
//     refuses to claim certainty it lacks.
//
// The filter's window is fixed: configure it ≥ the guard's Window. A
// shorter per-call window is honoured exactly only by a record of truth;
// a longer one cannot be (counted as CountWindowExceeded, warned once).
//
// # Projection: 1 billion IDs per day
//
// W = 24h, G = 4 (L = 6h), P = 1e-4, n = 1e9:
//
//	n_g = 2.5e8 IDs per generation; m = 2.5e8 · 22.53 = 5.63e9 bits = 704 MB per generation
//	memory: 5 live generations = 3.52 GB (in process, or in Redis as 11 shards of ≤ 64 MiB per
//	generation, spread over Cluster slots) — against 1e9 × 145 B = 145 GB of exact Redis keys
//	lease store: in-flight leases + done markers for Recent (30s): 11,574 msg/s × 30 s ≈ 350k
//	records ≈ 50 MB of Redis
//	round trips per message: with redisbloom.Store (lease, recent marker and filter bits in one
//	hash slot) Claim 1 + Complete 1 = 2, plus heartbeats — the same as the exact Redis store;
//	this package's generic Store over any lease store and filter needs 4 (filter and lease
//	separately). A filter hit (true duplicates older than Recent, and 1e-4 of new IDs =
//	~100,000 a day) adds the verifier lookup.
//	Lua cost: a lookup reads ≤ 6 bitmaps × k = 16 GETBITs (stops at the first zero bit: ~2 per
//	bitmap for a new ID); an Add does 16 SETBITs, an INCRBY and two PEXPIREATs.
//	rotation: nothing is coordinated or copied. Every 6 h the first Add of a generation creates
//	its 11 bitmaps at full size (704 MB allocated, zero-filled) and Redis expires the 704 MB
//	generation that fell out of the window; in process the ring swaps in a fresh 704 MB bitmap
//	and the GC frees the old one.
//	estimated FP gauge: one GET per shard and generation (55 small keys), never a bitmap scan.
package bloom
