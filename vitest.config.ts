import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: "forks",
    reporters: ["default"],
    // A reaper ends what a test started once its worker or the whole run is gone, however it
    // ends (a timeout, a crash, a kill): test/support/reaper/.
    globalSetup: ["test/support/reaper/globalSetup.ts"],
    setupFiles: ["test/support/reaper/workerSetup.ts", "test/support/testEnv.ts"]
  }
})
