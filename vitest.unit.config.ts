import { defineConfig } from "vitest/config"
import base from "./vitest.config.js"
import { slowInProcessFiles, spawningFiles } from "./vitest.lanes.js"

/**
 * `npm run test:unit`: the tests that start no process, in about a minute; `npm test` runs them with
 * the rest. A file that starts processes (a platform, an executor, a sidecar, ffmpeg, npm, a network
 * namespace) is named in vitest.lanes.ts, and test/support/noProcesses.ts fails a test here that
 * starts one.
 */
const workers = base.test?.maxWorkers

export default defineConfig({
  test: {
    ...base.test,
    exclude: ["test/integration/**", ...spawningFiles, ...slowInProcessFiles],
    // The files share workers: a worker imports effect, the tokenizers and the ONNX builder once for
    // many files, not once per file (measured on two cores: 41-45 s instead of 69, 74 CPU-s instead
    // of 125). (In the full suite, the same made the run slower: 710 s instead of 547.)
    isolate: false,
    // As many workers from the start to the end: a pool that shrinks terminates an idle fork, which
    // a shared lane may be about to reuse (vitest then reports "Terminating worker thread").
    minWorkers: workers,
    // No process to reap: the full suite's reaper (and its watchdog process) stays out.
    globalSetup: [],
    setupFiles: ["test/support/noProcesses.ts", "test/support/testEnv.ts"]
  }
})
