/*
 * A stand-in for libnccl.so for the plugin's tests: ncclGetVersion answers
 * what HZ_FAKE_NCCL_VERSION says (unset or unparsable: an error), and a
 * logger inside this library lets the plugin find it the way it finds a
 * privately loaded NCCL (through the logger's address).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define HZ_EXPORT __attribute__((visibility("default")))

HZ_EXPORT int ncclGetVersion(int* version) {
  const char* text = getenv("HZ_FAKE_NCCL_VERSION");
  if (version == NULL || text == NULL || text[0] == '\0') return 4; /* ncclInvalidArgument */
  char* end = NULL;
  long v = strtol(text, &end, 10);
  if (end == NULL || *end != '\0' || v < 0 || v > 1000000) return 4;
  *version = (int)v;
  return 0;
}

/* ncclDebugLogger_t: prints what the plugin logs when HZ_FAKE_NCCL_LOG is set. */
HZ_EXPORT void hz_fake_nccl_log(int level, unsigned long flags, const char* file, int line,
                                const char* fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  if (getenv("HZ_FAKE_NCCL_LOG") == NULL) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "NCCL %s ", level == 2 ? "WARN" : "INFO");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}
