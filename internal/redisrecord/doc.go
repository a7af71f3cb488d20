// Package redisrecord is the dedup record both Redis stores keep
// (dedup/redisstore and the tiered store of dedup/bloom/redisbloom): one
// string key whose value is "p:<token>" while a lease is held (the key's
// PX expiry is the lease) and "d" once done. It holds that format, the
// scripts that release and extend a lease, and the decoding of the
// {code, pttl} reply their claim scripts share. The claim and complete
// scripts stay with their stores: each reads more than the record.
package redisrecord
