// The Kafka client scenarios of pgstreams' conformance tests with KafkaJS: one line per scenario, the same
// as tests/conformance/scenarios.py prints for the other clients.
//   node scenarios.js BOOTSTRAP PREFIX
"use strict";
const { Kafka, CompressionTypes, ConfigResourceTypes, logLevel } = require("kafkajs");

const [bootstrap, prefix] = process.argv.slice(2);
const kafka = new Kafka({ clientId: "conformance", brokers: [bootstrap], logLevel: logLevel.NOTHING,
                          retry: { retries: 2 } });
const KEYED = Array.from({ length: 12 }, (_, i) => [`k${i % 6}`, `v${i}`]);

// [partition, value] of the first `count` records of `topic` a new group reads (from `offset` of partition 0
// when given, else from the beginning), or of those that came within 30 s.
async function read(topic, count, offset) {
  const consumer = kafka.consumer({ groupId: `${prefix}kafkajs-${topic}`, maxWaitTimeInMs: 100,
                                    rebalanceTimeout: 2000, sessionTimeout: 6000, heartbeatInterval: 500 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  if (offset !== undefined) {
    consumer.on(consumer.events.GROUP_JOIN, () => consumer.seek({ topic, partition: 0, offset: String(offset) }));
  }
  const got = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, 30000);
    consumer.run({
      eachMessage: async ({ partition, message }) => {
        got.push([partition, message.value.toString()]);
        if (got.length >= count) { clearTimeout(timer); resolve(); }
      },
    }).catch(reject);
  });
  await consumer.disconnect();
  return got;
}

// Ask the test to restart the broker (tests/conformance/scenarios.py's RESTART_REQUEST), and wait until it
// says it did.
const stdinLines = require("readline").createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function restartBroker() {
  console.log("restart the broker, please");
  await stdinLines.next();
}

// The line of `run`, or `SCENARIO: error NAME` when it threw (a broker that refused it).
async function guarded(scenario, run) {
  try {
    return await run();
  } catch (e) {
    if (process.env.SCENARIO_DEBUG) console.error(e);
    return `${scenario}: error ${e.name}`;
  }
}

function keyedLine(got) {
  const parts = new Map();
  for (const [p, v] of got) { if (!parts.has(p)) parts.set(p, []); parts.get(p).push(v); }
  return "keyed: " + [...parts.keys()].sort((a, b) => a - b).map((p) => `p${p}=${parts.get(p).join(",")}`).join(" ");
}

async function main() {
  const admin = kafka.admin();
  await admin.connect();
  const md = await admin.fetchTopicMetadata({ topics: [`${prefix}meta`] });
  console.log(`metadata: ${prefix}meta partitions=${md.topics[0].partitions.length}`);
  await admin.disconnect();
  const producer = kafka.producer({ allowAutoTopicCreation: false });
  await producer.connect();
  for (const [name, acks] of [["0", 0], ["1", 1], ["all", -1]]) {
    await producer.send({ topic: `${prefix}acks${name}`, acks,
                          messages: [0, 1, 2].map((i) => ({ key: `k${i}`, value: `v${i}` })) });
    const got = await read(`${prefix}acks${name}`, 3);
    console.log(`acks=${name}: ` + got.map(([, v]) => v).join(" "));
  }
  const admin2 = kafka.admin();
  await admin2.connect();
  await producer.send({ topic: `${prefix}latest`, messages: [{ value: "old0" }, { value: "old1" }] });
  const end = (await admin2.fetchTopicOffsets(`${prefix}latest`))[0].high;
  await producer.send({ topic: `${prefix}latest`, messages: [{ value: "new0" }] });
  console.log("from latest: " + (await read(`${prefix}latest`, 1, end)).map(([, v]) => v).join(" "));
  await producer.send({ topic: `${prefix}bytime`, messages: [{ value: "before0" }, { value: "before1" }] });
  const at = Date.now() + 1;
  await new Promise((r) => setTimeout(r, 10));  // the records after it are stamped later
  await producer.send({ topic: `${prefix}bytime`, messages: [{ value: "after0" }, { value: "after1" }] });
  const found = (await admin2.fetchTopicOffsetsByTimestamp(`${prefix}bytime`, at))[0].offset;
  console.log("from a time: " + (await read(`${prefix}bytime`, 2, found)).map(([, v]) => v).join(" "));
  await admin2.disconnect();
  for (const codec of ["gzip", "snappy", "lz4", "zstd"]) {
    // KafkaJS itself compresses with gzip only: the other codecs need packages of their own
    const type = { gzip: CompressionTypes.GZIP }[codec];
    if (type === undefined) {
      console.log(`compression=${codec}: unsupported by the client`);
      continue;
    }
    await producer.send({ topic: `${prefix}${codec}`, compression: type,
                          messages: [0, 1, 2].map((i) => ({ key: `k${i}`, value: `v${i}`.repeat(50) })) });
    const got = await read(`${prefix}${codec}`, 3);
    console.log(`compression=${codec}: ` + got.map(([, v]) => v.slice(0, 2)).join(" "));
  }
  for (const [key, value] of KEYED) {  // one at a time: the order within each partition is the order sent
    await producer.send({ topic: `${prefix}keyed`, messages: [{ key, value }] });
  }
  console.log(keyedLine(await read(`${prefix}keyed`, KEYED.length)));
  // an idempotent producer whose first produce response is lost (tests/conformance/_losing_proxy.py)
  console.log(await guarded("idempotence", async () => {
    const idempotent = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
    await idempotent.connect();
    await idempotent.send({ topic: `${prefix}idem`, messages: [0, 1, 2].map((i) => ({ value: `v${i}` })) });
    await idempotent.disconnect();
    await producer.send({ topic: `${prefix}idem`, messages: [{ value: "end" }] });
    return "idempotence: " + (await read(`${prefix}idem`, 4)).map(([, v]) => v).join(" ");
  }));
  let unknown = "stored";
  try {
    await producer.send({ topic: `${prefix}missing`, messages: [{ value: "x" }], timeout: 5000 });
  } catch (e) {
    unknown = "error";
  }
  console.log(`unknown topic: ${unknown}`);
  await producer.disconnect();
  // administration: a topic created with a configuration, described, and its configuration replaced
  // (KafkaJS has AlterConfigs, not IncrementalAlterConfigs)
  console.log(await guarded("admin", async () => {
    const admin3 = kafka.admin();
    await admin3.connect();
    const created = `${prefix}created`;
    await admin3.createTopics({ topics: [{ topic: created, numPartitions: 2,
                                           configEntries: [{ name: "retention.ms", value: "3600000" }] }] });
    const partitions = (await admin3.fetchTopicMetadata({ topics: [created] })).topics[0].partitions.length;
    const retention = async () => {
      const d = await admin3.describeConfigs({ includeSynonyms: false, resources: [
        { type: ConfigResourceTypes.TOPIC, name: created, configNames: ["retention.ms"] }] });
      return d.resources[0].configEntries.find((e) => e.configName === "retention.ms").configValue;
    };
    const before = await retention();
    await admin3.alterConfigs({ validateOnly: false, resources: [
      { type: ConfigResourceTypes.TOPIC, name: created, configEntries: [{ name: "retention.ms", value: "7200000" }] }] });
    const line = `admin: partitions=${partitions} retention.ms=${before} then ${await retention()}`;
    await admin3.disconnect();
    return line;
  }));
  await groupScenario();
  console.log(await guarded("transactions", transactions));
  const [sasl, user, password] = [process.env.SASL_BOOTSTRAP, process.env.SASL_USER, process.env.SASL_PASSWORD];
  if (!(sasl && user && password)) {
    console.log("authorization: not run (no SASL gateway)");
  } else {
    console.log(await guarded("authorization", () => authorization(sasl, user, password)));
  }
}

// As a role that may read a topic but not write to it (SASL PLAIN): the produce is refused, the read works.
async function authorization(sasl, username, password) {
  const secured = new Kafka({ clientId: "conformance", brokers: [sasl], logLevel: logLevel.NOTHING,
                              retry: { retries: 0 }, sasl: { mechanism: "plain", username, password } });
  const topic = `${prefix}secure`;
  const producer = secured.producer();
  await producer.connect();
  let denied = false;
  try {
    await producer.send({ topic, messages: [{ value: "x" }] });
  } catch (e) {
    denied = e.type === "TOPIC_AUTHORIZATION_FAILED";
  }
  await producer.disconnect();
  const consumer = secured.consumer({ groupId: `${prefix}sg`, maxWaitTimeInMs: 100, sessionTimeout: 10000,
                                      heartbeatInterval: 300 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const got = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, 30000);
    consumer.run({ autoCommit: false, eachMessage: async ({ message }) => {
      got.push(message.value.toString());
      clearTimeout(timer);
      resolve();
    } }).catch(reject);
  });
  await consumer.disconnect();
  return `authorization: produce=${denied ? "denied" : "allowed"} read=${got.join(" ")}`;
}

// A transactional producer that aborts a record and the input's offset sent with it, then commits two
// records and the next offset: a read-committed consumer reads only the committed ones.
async function transactions() {
  const tin = `${prefix}txin`;
  const tout = `${prefix}txout`;
  const plain = kafka.producer();
  await plain.connect();
  await plain.send({ topic: tin, messages: [{ value: "i0" }, { value: "i1" }] });
  await plain.disconnect();
  const admin = kafka.admin();
  await admin.connect();
  const committed = async () => {
    const [t] = await admin.fetchOffsets({ groupId: `${prefix}tx`, topics: [tin] });
    const offset = t.partitions[0].offset;
    return Number(offset) < 0 ? "none" : offset;
  };
  const offsets = (offset) => ({ consumerGroupId: `${prefix}tx`,
                                 topics: [{ topic: tin, partitions: [{ partition: 0, offset }] }] });
  const producer = kafka.producer({ transactionalId: `${prefix}tx`, maxInFlightRequests: 1, idempotent: true });
  await producer.connect();
  let txn = await producer.transaction();
  await txn.send({ topic: tout, messages: [{ value: "aborted" }] });
  await txn.sendOffsets(offsets("1"));
  await txn.abort();
  const afterAbort = await committed();
  txn = await producer.transaction();
  await txn.send({ topic: tout, messages: [{ value: "o0" }, { value: "o1" }] });
  await txn.sendOffsets(offsets("2"));
  await txn.commit();
  const afterCommit = await committed();
  await producer.disconnect();
  await admin.disconnect();
  const got = (await read(tout, 2)).map(([, v]) => v);
  return `transactions: offset after abort=${afterAbort} after commit=${afterCommit} read committed=${got.join(" ")}`;
}

// Two members split the topic's two partitions and read what is there; the first leaves and the second
// takes its partition; the second leaves too, and a third member resumes from their commits.
async function groupScenario() {
  const topic = `${prefix}group`;
  let producer = kafka.producer();
  await producer.connect();
  const produceTo = async (records) => {
    for (const [partition, value] of records) await producer.send({ topic, messages: [{ value, partition }] });
  };
  const member = async () => {
    const m = { assigned: new Set(), values: [] };
    m.consumer = kafka.consumer({ groupId: `${prefix}g`, maxWaitTimeInMs: 100, sessionTimeout: 10000,
                                  heartbeatInterval: 300, rebalanceTimeout: 10000 });
    m.consumer.on(m.consumer.events.GROUP_JOIN,
                  (e) => { m.assigned = new Set(e.payload.memberAssignment[topic] || []); });
    await m.consumer.connect();
    await m.consumer.subscribe({ topic, fromBeginning: true });
    await m.consumer.run({ autoCommitThreshold: 1,
                           eachMessage: async ({ message }) => { m.values.push(message.value.toString()); } });
    return m;
  };
  const until = async (cond) => {
    const end = Date.now() + 30000;
    while (!cond() && Date.now() < end) await new Promise((r) => setTimeout(r, 50));
    return cond();
  };
  const one = await member();
  const two = await member();
  const split = await until(() => one.assigned.size === 1 && two.assigned.size === 1
                                  && !one.assigned.has([...two.assigned][0]));
  await produceTo([[0, "a0"], [0, "a1"], [1, "a2"], [1, "a3"]]);
  await until(() => one.values.length + two.values.length >= 4);
  const first = [...one.values, ...two.values];
  const read = two.values.length;
  await one.consumer.disconnect();
  await until(() => two.assigned.size === 2);
  await produceTo([[0, "b0"], [1, "b1"]]);
  await until(() => two.values.length >= read + 2);
  const handed = two.values.slice(read);
  await two.consumer.disconnect();
  await produceTo([[0, "c0"], [1, "c1"]]);
  const three = await member();
  await until(() => three.values.length >= 2);
  await until(() => three.assigned.size === 2);
  const resumed = three.values.length;
  await producer.disconnect();
  await restartBroker();
  producer = kafka.producer();
  await producer.connect();
  await produceTo([[0, "d0"], [1, "d1"]]);
  await until(() => three.values.length >= resumed + 2);
  await three.consumer.disconnect();
  await producer.disconnect();
  console.log(`group: split=${split ? "yes" : "no"} first=${first.sort().join(" ")} handed over=${handed.sort().join(" ")} `
              + `resumed=${three.values.slice(0, resumed).sort().join(" ")} `
              + `after the broker restarted=${three.values.slice(resumed).sort().join(" ")}`);
}

main().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });
