import { describe, expect, it } from "vitest"
import { platformLaunch } from "../../../src/executors/common/ExecutorCommand.js"
import { workerChild, workerTunables } from "../../../src/executors/common/EarlySpawn.js"

describe("a worker's glibc tunables", () => {
  it("ask malloc for transparent huge pages, beside the operator's own tunables", () => {
    expect(workerTunables(undefined)).toBe("glibc.malloc.hugetlb=1")
    expect(workerTunables("")).toBe("glibc.malloc.hugetlb=1")
    expect(workerTunables("glibc.malloc.arena_max=2")).toBe("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
  })

  it("keep the operator's own choice of huge pages", () => {
    expect(workerTunables("glibc.malloc.hugetlb=0")).toBe("glibc.malloc.hugetlb=0")
    expect(workerTunables("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0")).toBe(
      "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"
    )
  })

  it("are in the environment a worker is started with", () => {
    const options = platformLaunch(["--kind", "llm", "--model", "cornserve/tiny-color-vlm", "--devices", "cpu:0"])!
    const config = { ...options, modelDir: "/models/tiny-color-vlm", runDir: "/run/executor-0" }
    expect(workerChild(config, 0, 1234).env).toMatchObject({
      GLIBC_TUNABLES: workerTunables(process.env.GLIBC_TUNABLES)
    })
  })
})
