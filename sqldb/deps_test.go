package sqldb_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestDependencyHygiene: the SQL layer's core and the components over it
// compile no SQL driver, and each dialect package compiles only its own (a
// PostgreSQL user never builds MySQL's or SQLite's driver, and vice versa);
// dburl, for tools that take any database, compiles the three.
func TestDependencyHygiene(t *testing.T) {
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	drivers := map[string]string{
		"postgres": "github.com/jackc/pgx/v5",
		"mysql":    "github.com/go-sql-driver/mysql",
		"sqlite":   "modernc.org/sqlite",
		"redis":    "github.com/redis/go-redis/v9",
	}
	pkgs := map[string]string{
		".":                              "",
		"./postgres":                     "postgres",
		"./mysql":                        "mysql",
		"./sqlite":                       "sqlite",
		"./sqldbtest":                    "",
		"../dedup/sqlstore":              "",
		"../dedup/sqlstore/sqlstoretest": "",
		"../inbox":                       "",
		"../outbox":                      "",
		"../business":                    "",
		"../business/businesstest":       "",
		"./dburl":                        "postgres,mysql,sqlite",
	}
	for pkg, own := range pkgs {
		out, err := exec.Command(goTool, "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		deps := map[string]bool{}
		for _, d := range strings.Fields(string(out)) {
			deps[d] = true
		}
		for name, driver := range drivers {
			if got, want := deps[driver], slices.Contains(strings.Split(own, ","), name); got != want {
				t.Errorf("%s depends on %s: %v, want %v", pkg, driver, got, want)
			}
		}
	}
}
