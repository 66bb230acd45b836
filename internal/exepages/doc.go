// Package exepages drops a process's page-table entries for the read-only
// mappings of its own executable (text, rodata and the pclntab beside it),
// so that pages the binary touched only while starting stop counting in the
// process's Rss and Pss until it touches them again.
//
// It never frees memory of the process: madvise(MADV_DONTNEED) on a
// read-only, private, file-backed mapping only unmaps page-cache pages,
// which stay in the page cache (and stay charged to the memory cgroup that
// read them in) until the kernel reclaims them; a later access faults them
// back in from the page cache, without I/O while they are cached. What it
// changes is what the process maps: its Pss, and which of those pages the
// kernel may reclaim first (clean and unmapped).
//
//	n, err := exepages.Release(exepages.DefaultProcRoot)
//
// Writable mappings (data, bss) are never touched: dropping them would lose
// what the process wrote; nor is a read-only mapping that holds private
// copies (a PIE's RELRO data, which the dynamic loader relocated).
package exepages
