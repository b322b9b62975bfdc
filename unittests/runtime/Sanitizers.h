//===- Sanitizers.h - What the sanitizer build changes for a test -*- C++ -*-===//
//
// scripts/test.sh runs every test a second time built with AddressSanitizer.
// ASan reserves terabytes of shadow address space, so an RLIMIT_AS cap would
// stop the process before main; there the cap is left off and ASan's own
// allocation bound (max_allocation_size_mb, allocator_may_return_null in the
// lit config) turns a runaway allocation into std::bad_alloc instead.
//
//===----------------------------------------------------------------------===//

#ifndef MTPRT_UNITTESTS_SANITIZERS_H
#define MTPRT_UNITTESTS_SANITIZERS_H

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

/// What a test's hang guard (the seconds it gives a child process before
/// killing it) is multiplied by: an ASan + UBSan build runs LibTorch several
/// times slower, more so with the two suites on two cores. The guard only
/// catches hangs; no test measures time.
inline constexpr int kTimeScale = kAddressSanitizer ? 6 : 1;

#endif // MTPRT_UNITTESTS_SANITIZERS_H
