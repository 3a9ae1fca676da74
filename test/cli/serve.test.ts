import { describe, expect, it } from "vitest"
import { runCli } from "../support/platform.js"

describe("cornserve serve: its command line", () => {
  it("refuses a --devices entry that is not a device, naming it, with the usage exit code", async () => {
    const result = await runCli(["serve", "--port", "0", "--devices", "cpu:0,foo"])
    expect(result.code).toBe(2)
    expect(result.stdout + result.stderr).toContain('--devices: "foo" is not a device')
  })

  it("refuses a --devices list that names a device twice", async () => {
    const result = await runCli(["serve", "--port", "0", "--devices", "cpu:1,cpu:1"])
    expect(result.code).toBe(2)
    expect(result.stdout + result.stderr).toContain("--devices names a device twice: cpu:1,cpu:1")
  })
})
