package redisstore

// PerKeyBatches makes s send its batches as a command per key, as it does
// for Cluster and Ring clients, so the conformance suite covers that path
// on a single server.
func PerKeyBatches(s *Store) *Store {
	s.oneScript = false
	return s
}
