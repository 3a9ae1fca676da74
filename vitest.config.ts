import { availableParallelism } from "node:os"
import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Backstops: a test or hook that starts executors bounds its own waits by the executors it
    // starts (test/support/platform.ts, `readyWithin`), which on a slow or busy two-core host take
    // minutes; these limits only end one that hangs.
    testTimeout: 120_000,
    hookTimeout: 600_000,
    pool: "forks",
    // More files at once than cores, even on two: the integration tests spend much of their time
    // waiting on processes they start, on clients that read slowly and on timers. Measured on two
    // cores, quiet: two at a time kept the cores 87% busy and ran the suite in 650 s, three 95% in
    // 547 s.
    maxWorkers: Math.max(3, availableParallelism() - 1),
    reporters: ["default"],
    // A reaper ends what a test started once its worker or the whole run is gone, however it
    // ends (a timeout, a crash, a kill): test/support/reaper/.
    globalSetup: ["test/support/reaper/globalSetup.ts"],
    setupFiles: ["test/support/reaper/workerSetup.ts", "test/support/testEnv.ts"]
  }
})
