import { describe, expect, it } from "vitest"
import { UniqueNames } from "../../../src/app-runtime/driver/UniqueNames.js"

describe("UniqueNames", () => {
  it("gives a free name as it is, a taken one the least free suffix from 2 up", () => {
    const names = new UniqueNames(["Reserved"])
    expect(names.take("Request")).toBe("Request")
    expect(names.take("Request")).toBe("Request_2")
    expect(names.take("Request_3")).toBe("Request_3")
    expect(names.take("Request")).toBe("Request_4")
    expect(names.take("Reserved")).toBe("Reserved_2")
    expect(names.take("Request_2")).toBe("Request_2_2")
  })

  it("names 24,000 colliding names apart in linear time", () => {
    const names = new UniqueNames()
    const given = Array.from({ length: 24_000 }, () => names.take("_"))
    expect(new Set(given).size).toBe(24_000)
    expect(given.at(-1)).toBe("__24000")
  })
})
