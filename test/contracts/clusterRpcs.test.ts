import { Either, Schema } from "effect"
import { describe, expect, it } from "vitest"
import { maxNodeDevices, NodeInfo, nodeNameProblem } from "../../src/contracts/ClusterRpcs.js"

/** The rules a joining node's name and its account of its devices are held to. */

describe("ClusterRpcs: node names and devices", () => {
  it("takes DNS-label names, refuses paths, overlong names, uppercase and reserved names", () => {
    for (const name of ["node-a", "gke-pool-1.zone_b", "n0"]) expect(nodeNameProblem(name)).toBeUndefined()
    for (const name of ["../../x", "a".repeat(64), "Node-A", "-a", "a..b", "", "__proto__"])
      expect(nodeNameProblem(name)).toMatch(/is not 1 to 63 lowercase letters/)
    expect(nodeNameProblem("local")).toMatch(/"local" is reserved \(it is the default of --node-name\)/)
    expect(nodeNameProblem("constructor")).toMatch(/is reserved/)
  })

  it(`bounds the devices a node may say it has at ${maxNodeDevices}`, () => {
    const node = (devices: number) => ({
      name: "node-a",
      instance: "i",
      devices: Array.from({ length: devices }, (_, index) => ({ id: `cpu:${index}`, type: "cpu", index })),
      advertiseHost: "127.0.0.1",
      rpcPort: 1,
      executors: []
    })
    expect(Either.isRight(Schema.decodeUnknownEither(NodeInfo)(node(maxNodeDevices)))).toBe(true)
    expect(Either.isLeft(Schema.decodeUnknownEither(NodeInfo)(node(maxNodeDevices + 1)))).toBe(true)
  })
})
