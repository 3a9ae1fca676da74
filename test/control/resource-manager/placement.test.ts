import { Either } from "effect"
import { describe, expect, it } from "vitest"
import {
  executorsToGive,
  freeDevices,
  type GivableExecutor,
  type Holding,
  type PlacedExecutor,
  type PlacementNode,
  type PlacementRequest,
  place
} from "../../../src/control/resource-manager/Placement.js"
import { parseDevices } from "../../../src/node/Devices.js"

const node = (name: string, devices: string, state: PlacementNode["state"] = "ready"): PlacementNode => ({
  name,
  state,
  devices: parseDevices(devices)
})

const request = (task: string, overrides: Partial<PlacementRequest> = {}): PlacementRequest => ({
  task,
  executors: 1,
  devicesPerExecutor: 1,
  related: [],
  ...overrides
})

const placed = (
  nodes: ReadonlyArray<PlacementNode>,
  holdings: ReadonlyArray<Holding>,
  requests: ReadonlyArray<PlacementRequest>
): ReadonlyArray<PlacedExecutor> => {
  const answer = place(nodes, holdings, requests)
  if (Either.isLeft(answer)) throw new Error(`expected a placement, got: ${answer.left.message}`)
  return answer.right
}

const where = (executors: ReadonlyArray<PlacedExecutor>) =>
  executors.map((executor) => `${executor.task}@${executor.node}:${executor.devices.map((d) => d.id).join("+")}`)

describe("placement: where a task's executors run", () => {
  it("puts a consumer on the node of its producer when that node has room", () => {
    const nodes = [node("a", "cpu:0,cpu:1"), node("b", "cpu:0,cpu:1,cpu:2")]
    const holdings: Array<Holding> = [{ node: "a", device: "cpu:0", task: "encoder" }]
    const [llm] = placed(nodes, holdings, [request("llm", { related: ["encoder"] })])
    expect(where([llm!])).toEqual(["llm@a:cpu:1"])
    expect(llm!.reason).toBe("with related task encoder")
  })

  it("places tasks deployed together on one node, in the order given, when they fit", () => {
    const nodes = [node("a", "cpu:0,cpu:1"), node("b", "cpu:0,cpu:1")]
    const answer = placed(nodes, [], [request("encoder", { related: ["llm"] }), request("llm")])
    expect(where(answer)).toEqual(["encoder@a:cpu:0", "llm@a:cpu:1"])
  })

  it("spreads unrelated executors: the node with the most free devices, then the fewest of the task", () => {
    const nodes = [node("a", "cpu:0,cpu:1"), node("b", "cpu:0,cpu:1"), node("c", "cpu:0")]
    const answer = placed(nodes, [], [request("encoder", { executors: 3 })])
    expect(where(answer)).toEqual(["encoder@a:cpu:0", "encoder@b:cpu:0", "encoder@c:cpu:0"])
    const held: Array<Holding> = [
      { node: "a", device: "cpu:0", task: "other" },
      { node: "b", device: "cpu:0", task: "llm" }
    ]
    const [next] = placed([node("a", "cpu:0,cpu:1"), node("b", "cpu:0,cpu:1")], held, [request("llm")])
    expect(next!.node).toBe("a")
    expect(next!.reason).toBe("fewest executors of this task")
  })

  it("keeps an executor where it already runs when its devices are free (a restarted control plane)", () => {
    const nodes = [node("a", "cpu:0,cpu:1"), node("b", "cpu:0,cpu:1")]
    const answer = placed(nodes, [], [request("llm", { executors: 2, preferred: [{ node: "b", devices: ["cpu:1"] }] })])
    expect(where(answer)).toEqual(["llm@b:cpu:1", "llm@a:cpu:0"])
    expect(answer[0]!.reason).toBe("kept: already runs there")
    const taken = placed(
      nodes,
      [{ node: "b", device: "cpu:1", task: "other" }],
      [request("llm", { preferred: [{ node: "b", devices: ["cpu:1"] }] })]
    )
    expect(taken[0]!.reason).not.toBe("kept: already runs there")
  })

  it("never spans nodes, never takes a held device, skips lost and avoided nodes", () => {
    const nodes = [
      node("a", "cpu:0,cpu:1"),
      node("b", "cpu:0,cpu:1,cpu:2,cpu:3"),
      node("c", "cpu:0,cpu:1,cpu:2", "lost")
    ]
    const holdings: Array<Holding> = [{ node: "b", device: "cpu:1", task: "other" }]
    const answer = placed(nodes, holdings, [request("llm", { devicesPerExecutor: 3 })])
    expect(where(answer)).toEqual(["llm@b:cpu:0+cpu:2+cpu:3"])
    const avoided = place(nodes, holdings, [request("llm", { devicesPerExecutor: 2, avoidNodes: ["b"] })])
    expect(Either.isRight(avoided) && where(avoided.right)).toEqual(["llm@a:cpu:0+cpu:1"])
    expect([...freeDevices(nodes, holdings).keys()]).toEqual(["a", "b"])
    expect(
      freeDevices(nodes, holdings)
        .get("b")!
        .map((d) => d.id)
    ).toEqual(["cpu:0", "cpu:2", "cpu:3"])
  })

  it("places all of a call or nothing, and says what was short and where there was room", () => {
    const nodes = [node("a", "cpu:0,cpu:1"), node("b", "cpu:0")]
    const answer = place(
      nodes,
      [{ node: "b", device: "cpu:0", task: "other" }],
      [request("encoder"), request("llm", { executors: 2 })]
    )
    expect(Either.isLeft(answer)).toBe(true)
    const shortfall = Either.isLeft(answer) ? answer.left : undefined
    expect(shortfall).toMatchObject({ task: "llm", executors: 2, unplaced: 1, takenByEarlier: 1 })
    // The llm's own executor placed before the shortfall counts as free again; the encoder's does not.
    expect(shortfall!.room).toEqual([
      { node: "a", free: 1, total: 2, avoided: false },
      { node: "b", free: 0, total: 1, avoided: false }
    ])
    expect(shortfall!.message).toBe(
      "task llm needs 1 device(s) per executor, 2 executor(s); free: a 1 of 2, b 0 of 1 (1 executor(s) short); tasks placed with it take 1 device(s)"
    )
    const nothing = place([node("a", "cpu:0", "lost")], [], [request("llm")])
    expect(Either.isLeft(nothing) && nothing.left.message).toBe(
      "task llm needs 1 device(s) per executor, 1 executor(s); free: no ready node (1 executor(s) short)"
    )
  })

  it("is a function of its input: the same state gives the same answer", () => {
    const nodes = [node("b", "cpu:0,cpu:1"), node("a", "cpu:0,cpu:1")]
    const requests = [request("encoder", { executors: 2 }), request("llm", { related: ["encoder"] })]
    expect(where(placed(nodes, [], requests))).toEqual(where(placed(nodes, [], requests)))
    expect(where(placed(nodes, [], requests))).toEqual(["encoder@a:cpu:0", "encoder@b:cpu:0", "llm@a:cpu:1"])
  })

  it("shares CPU devices when none is free: least shared first, a task once per device, each executor its share of threads", () => {
    const nodes = [node("a", "cpu:0/4,cpu:1/4")]
    // color_chat's three tasks on two CPU devices: the third shares, and gets half the device's threads.
    const chat = placed(
      nodes,
      [],
      [
        request("audio", { share: true }),
        request("image", { share: true, related: ["audio"] }),
        request("llm", { share: true, related: ["audio", "image"] })
      ]
    )
    expect(where(chat)).toEqual(["audio@a:cpu:0", "image@a:cpu:1", "llm@a:cpu:0"])
    expect(chat.map((executor) => executor.threads)).toEqual([4, 4, 2])
    expect(chat[2]!.reason).toBe("shares cpu:0 with audio (no free device)")

    const holdings: Array<Holding> = chat.map((executor) => ({
      node: executor.node,
      device: executor.devices[0]!.id,
      task: executor.task
    }))
    // The next task goes to the device with fewer executors; a third on cpu:0 would get a third of 4.
    const next = placed(nodes, holdings, [request("geri", { share: true })])
    expect(where(next)).toEqual(["geri@a:cpu:1"])
    expect(next[0]!.threads).toBe(2)
    // A task never takes one device twice: a second llm executor goes to cpu:1, a third finds no device.
    expect(where(placed(nodes, holdings, [request("llm", { share: true })]))).toEqual(["llm@a:cpu:1"])
    const third = place(nodes, holdings, [request("llm", { executors: 2, share: true })])
    expect(Either.isLeft(third) && third.left.message).toContain("CPU devices held by other tasks were open to it")
    // Without `share` nothing changes: no free device, no placement.
    expect(Either.isLeft(place(nodes, holdings, [request("geri")]))).toBe(true)
  })

  it("prefers free devices over shared ones, and never shares a GPU", () => {
    const nodes = [node("a", "cpu:0/2,cuda:0"), node("b", "cpu:0/2")]
    const holdings: Array<Holding> = [
      { node: "a", device: "cpu:0", task: "encoder" },
      { node: "a", device: "cuda:0", task: "llm" }
    ]
    // b's device is free: no sharing, all of its threads.
    const free = placed(nodes, holdings, [request("geri", { share: true })])
    expect(where(free)).toEqual(["geri@b:cpu:0"])
    expect(free[0]!.threads).toBe(2)
    // With b held too, the new task shares a CPU device; the GPU is never offered.
    const shared = placed(
      nodes,
      [...holdings, { node: "b", device: "cpu:0", task: "other" }],
      [request("geri", { share: true, related: ["encoder"] })]
    )
    expect(where(shared)).toEqual(["geri@a:cpu:0"])
    expect(shared[0]!.threads).toBe(1)
    const gpuOnly = place(
      [node("g", "cuda:0")],
      [{ node: "g", device: "cuda:0", task: "llm" }],
      [request("other", { share: true })]
    )
    expect(Either.isLeft(gpuOnly)).toBe(true)
  })

  it("counts a shared device as held by each of its tasks, and free only when none holds it", () => {
    const nodes = [node("a", "cpu:0,cpu:1")]
    const holdings: Array<Holding> = [
      { node: "a", device: "cpu:0", task: "x" },
      { node: "a", device: "cpu:0", task: "y" }
    ]
    expect(
      freeDevices(nodes, holdings)
        .get("a")!
        .map((device) => device.id)
    ).toEqual(["cpu:1"])
  })

  it("gives up executors for a task only where it then fits: all on one node, the fewest, else none", () => {
    // Two GPUs per node, each held by a one-GPU executor; the LLM needs two GPUs on one node.
    const nodes = [node("a", "cuda:0,cuda:1"), node("b", "cuda:0,cuda:1")]
    const holdings: Array<Holding> = [
      { node: "a", device: "cuda:0", task: "enc" },
      { node: "a", device: "cuda:1", task: "gen" },
      { node: "b", device: "cuda:0", task: "enc" },
      { node: "b", device: "cuda:1", task: "gen" }
    ]
    const executor = (task: string, id: string, at: string, device: string): GivableExecutor => ({
      task,
      id,
      node: at,
      devices: [device]
    })
    const enc = [executor("enc", "e2", "b", "cuda:0"), executor("enc", "e1", "a", "cuda:0")]
    const gen = [executor("gen", "g2", "b", "cuda:1"), executor("gen", "g1", "a", "cuda:1")]
    const llm = request("llm", { devicesPerExecutor: 2 })
    // Each donor's latest executor is on b: giving both frees b whole.
    expect(executorsToGive(nodes, holdings, [enc, gen], llm)).toEqual([enc[0], gen[0]])
    // When one donor runs on b only and the other on a only, no node is freed whole: nothing is given.
    const split: Array<Holding> = [
      { node: "a", device: "cuda:0", task: "enc" },
      { node: "a", device: "cuda:1", task: "other" },
      { node: "b", device: "cuda:0", task: "other" },
      { node: "b", device: "cuda:1", task: "gen" }
    ]
    expect(
      executorsToGive(
        nodes,
        split,
        [[executor("enc", "e1", "a", "cuda:0")], [executor("gen", "g1", "b", "cuda:1")]],
        llm
      )
    ).toBeUndefined()
    // A free device on the node counts: one executor given there is enough, and the fewest are chosen.
    const roomy: Array<Holding> = [
      { node: "a", device: "cuda:0", task: "enc" },
      { node: "b", device: "cuda:0", task: "enc" },
      { node: "b", device: "cuda:1", task: "gen" }
    ]
    expect(executorsToGive(nodes, roomy, [enc, gen], llm)).toEqual([enc[1]])
    // A request that fits already needs nothing given.
    expect(executorsToGive(nodes, holdings.slice(0, 2), [enc, gen], llm)).toEqual([])
    // The same executor is never given twice for two asks of one donor.
    const one = [executor("enc", "e1", "a", "cuda:0")]
    const onlyEnc: Array<Holding> = [
      { node: "a", device: "cuda:0", task: "enc" },
      { node: "a", device: "cuda:1", task: "other" }
    ]
    expect(executorsToGive([nodes[0]!], onlyEnc, [one, one], llm)).toBeUndefined()
  })

  it("tells the free devices of a shortfall, not counting the shared ones the request took before it fell short", () => {
    const held: ReadonlyArray<Holding> = [
      { node: "local", device: "cpu:0", task: "enc" },
      { node: "local", device: "cpu:1", task: "llm" },
      { node: "local", device: "cpu:2", task: "gen" }
    ]
    const answer = place([node("local", "cpu:0,cpu:1,cpu:2,cpu:3")], held, [
      request("enc", { executors: 9, share: true })
    ])
    if (Either.isRight(answer)) throw new Error("expected a shortfall")
    expect(answer.left.room).toEqual([{ node: "local", free: 1, total: 4, avoided: false }])
    expect(answer.left.unplaced).toBe(6)
    expect(answer.left.message).toMatch(/free: local 1 of 4 \(6 executor\(s\) short\)/)
  })
})
