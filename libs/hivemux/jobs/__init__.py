"""Job control: the pure deciding core of users' job commands (`control`)."""
