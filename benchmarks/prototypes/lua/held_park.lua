-- (a) A run held by one worker joins the line by reference: its ticket and the node
-- that holds it. KEYS[1] the line, KEYS[2] ticket -> node. ARGV: ticket, node.
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return redis.call('LLEN', KEYS[1])
