// Package display holds the text helpers of what an operator reads: the
// tables of the idemq command and the views of its web console.
package display
