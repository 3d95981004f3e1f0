//go:build unix

package file

import (
	"io/fs"
	"syscall"
)

// inode returns the file's inode and device numbers.
func inode(fi fs.FileInfo) (ino, dev uint64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino), uint64(st.Dev)
	}
	return 0, 0
}
