// Package mysql holds the business helpers' MySQL/MariaDB part:
// duplicate-key detection for github.com/go-sql-driver/mysql errors. Use
// business.SQL for the Execer.
package mysql

import (
	"errors"

	"github.com/go-sql-driver/mysql"
)

// ErDupEntry is MySQL's error number for a duplicate key (ER_DUP_ENTRY).
const ErDupEntry = 1062

// IsDuplicateKey reports whether err is (or wraps) a *mysql.MySQLError
// number 1062.
func IsDuplicateKey(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == ErDupEntry
}
